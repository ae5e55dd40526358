"""`POST /v1/completions` with the openai SDK: plain continuation and fill-in-the-middle on generated models.

The FIM models carry `<|fim_prefix|>` / `<|fim_suffix|>` / `<|fim_middle|>` control tokens, named in
the GGUF metadata (`tokenizer.ggml.fim_*_token_id`) or found by llama.cpp from their text alone. A
FIM request must decode exactly what the same tokens written out by hand decode; a model without
FIM tokens gets a clear 400. An editor's abandoned completion must not hold up the next one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gguf_factory import write_tiny_gguf
from support import TINY_ID, LiveDaemon, wait_until

FIM_META = "fim-meta:1m-f32"
FIM_NAMES = "fim-names:1m-f32"
FIM_SLOW = "fim-slow:4m-f32"
PREFIX = "def hello():\n    return "
SUFFIX = "\n\nprint(hello())\n"


@pytest.fixture(scope="module")
def live_files(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> list[Path]:
    models = tmp_path_factory.mktemp("fim-models")
    return [
        tiny_gguf,
        write_tiny_gguf(models / "fim-meta.gguf", basename="fim-meta", fim="metadata", seed=7),
        write_tiny_gguf(models / "fim-names.gguf", basename="fim-names", fim="names", seed=8),
        write_tiny_gguf(
            models / "fim-slow.gguf",
            basename="fim-slow",
            size_label="4M",
            fim="metadata",
            context_length=4096,
            embedding=256,
            blocks=4,
            ffn=1024,
            seed=1,
        ),
    ]


@pytest.fixture(scope="module")
def live_config() -> dict[str, Any]:
    return {"parallel": 1, "threads": 1, "max_loaded_models": 4}


@pytest.fixture(scope="module")
def sdk(live: LiveDaemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0, timeout=300) as client:
        yield client


def test_listings_say_which_models_fill_in_the_middle(live: LiveDaemon, sdk: openai.OpenAI) -> None:
    """Read from the GGUF headers before any model is loaded: an LMSP extension on /lmsp/v1 (whose
    capability names are fixed), a capability on /v1/models; and true to what a `suffix` request does."""
    fim = {FIM_META: True, FIM_NAMES: True, FIM_SLOW: True, TINY_ID: False}
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        listing = {m["id"]: m for m in c.get("/models").json()["data"]}
        assert {i: listing[i]["state"] for i in fim} == dict.fromkeys(fim, "available")  # nothing loaded
        for model_id, expected in fim.items():
            for lmsp in (listing[model_id], c.get(f"/models/{model_id}").json()):
                assert lmsp["extensions"]["lmsp_tray"]["fill_in_the_middle"] is expected
                assert "fill_in_the_middle" not in lmsp["capabilities"] and "text" in lmsp["capabilities"]
            v1 = c.get(f"{live.base}/v1/models/{model_id}").json()
            assert ("fill_in_the_middle" in v1["capabilities"]) is expected
            assert v1["capabilities"][: len(lmsp["capabilities"])] == lmsp["capabilities"]
        v1_list = {m["id"]: m for m in c.get(f"{live.base}/v1/models").json()["data"]}
        assert {i: "fill_in_the_middle" in v1_list[i]["capabilities"] for i in fim} == fim
    for model_id, expected in fim.items():
        if expected:
            done = sdk.completions.create(model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=1)
            assert done.choices[0].finish_reason == "length"
        else:
            with pytest.raises(openai.BadRequestError) as refused:
                sdk.completions.create(model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=1)
            assert refused.value.code == "unsupported_capability"


@pytest.mark.parametrize("model", [FIM_META, FIM_NAMES])
def test_fill_in_the_middle_uses_the_models_fim_tokens(sdk: openai.OpenAI, model: str) -> None:
    fim = sdk.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=12, temperature=0)
    assert fim.object == "text_completion" and fim.id.startswith("cmpl-") and fim.model == model
    (choice,) = fim.choices
    assert choice.text and choice.finish_reason == "length" and choice.index == 0
    # The same prompt spelt out with the FIM tokens' text: the same tokens, so the same greedy output.
    spelt = "<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>"
    plain = sdk.completions.create(model=model, prompt=spelt, max_tokens=12, temperature=0)
    assert plain.choices[0].text == choice.text
    assert fim.usage is not None and plain.usage is not None
    assert fim.usage.prompt_tokens == plain.usage.prompt_tokens and fim.usage.completion_tokens == 12
    # Without the suffix it is another prompt, and (with these weights) another answer.
    other = sdk.completions.create(model=model, prompt=PREFIX, max_tokens=12, temperature=0)
    assert other.usage is not None and other.usage.prompt_tokens < fim.usage.prompt_tokens


def test_fim_text_is_not_parsed_for_special_tokens(sdk: openai.OpenAI) -> None:
    """Code may contain a FIM token's text; in a prefix it is text, not a token."""
    tricky = sdk.completions.create(
        model=FIM_META, prompt="x = '<|fim_middle|>'", suffix="", max_tokens=1, temperature=0
    )
    spelt = sdk.completions.create(
        model=FIM_META, prompt="<|fim_prefix|>x = '<|fim_middle|>'<|fim_suffix|><|fim_middle|>", max_tokens=1
    )
    assert tricky.usage is not None and spelt.usage is not None
    assert tricky.usage.prompt_tokens > spelt.usage.prompt_tokens


def test_streamed_completion_equals_sync(sdk: openai.OpenAI, live: LiveDaemon) -> None:
    whole = sdk.completions.create(model=FIM_META, prompt=PREFIX, suffix=SUFFIX, max_tokens=10, temperature=0)
    chunks = list(
        sdk.completions.create(
            model=FIM_META,
            prompt=PREFIX,
            suffix=SUFFIX,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    body = {"model": TINY_ID, "prompt": "hello", "max_tokens": 3, "stream": True, "echo": True}
    with (
        httpx.Client(timeout=120, headers=live.auth_headers) as c,
        c.stream("POST", live.base + "/v1/completions", json=body) as r,
    ):
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][6:])["choices"][0]["text"] == "hello"  # echo comes first


def test_refusals(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as no_fim:
        sdk.completions.create(model=TINY_ID, prompt=PREFIX, suffix=SUFFIX, max_tokens=4)
    assert no_fim.value.code == "unsupported_capability" and no_fim.value.param == "suffix"
    assert TINY_ID in no_fim.value.message and "fill-in-the-middle" in no_fim.value.message
    with pytest.raises(openai.BadRequestError) as several:
        sdk.completions.create(model=TINY_ID, prompt=["a", "b"], max_tokens=4)
    assert several.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as n:
        sdk.completions.create(model=TINY_ID, prompt="a", n=2)
    assert n.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="no-such-model", prompt="a")
    plain = sdk.completions.create(model=TINY_ID, prompt="hello world", max_tokens=3, temperature=0)
    assert plain.choices[0].finish_reason == "length" and plain.usage is not None


def test_an_abandoned_completion_does_not_hold_up_the_next(live: LiveDaemon, sdk: openai.OpenAI) -> None:
    """Editors cancel the last completion when the person types on: with one sequence per model, the next
    request runs at once because closing the stream cancelled the first within a step."""
    sdk.completions.create(model=FIM_SLOW, prompt="warm", max_tokens=1)
    scheduler = live.scheduler(FIM_SLOW)
    before = scheduler.steps
    long = {"model": FIM_SLOW, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 3000, "stream": True}
    with (
        httpx.Client(timeout=300, headers=live.auth_headers) as c,
        c.stream("POST", live.base + "/v1/completions", json=long) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # the person typed on: the editor drops this completion
    # The sync path too: a client that gives up on a sync request cancels it.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            live.base + "/v1/completions",
            json={**long, "stream": False},
            headers=live.auth_headers,
            timeout=httpx.Timeout(300, read=1.0),
        )
    wait_until(lambda: scheduler.generating == 0 and scheduler.queued == 0, 120, "the abandoned runs to stop")
    done = sdk.completions.create(model=FIM_SLOW, prompt=PREFIX, suffix=SUFFIX, max_tokens=5, temperature=0)
    assert done.choices[0].finish_reason == "length"
    assert scheduler.steps - before < 3000  # neither abandoned request ran to its 3000 tokens


def test_completion_logprobs_in_the_legacy_shape(sdk: openai.OpenAI) -> None:
    done = sdk.completions.create(model=TINY_ID, prompt="hello world", max_tokens=5, temperature=0, logprobs=2)
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and len(logprobs.tokens) == 5
    assert logprobs.token_logprobs is not None and all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.top_logprobs is not None and all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    for token, lp, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert max(top.values()) == lp and top[token] == lp  # greedy: the pick is the most likely
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    chunks = list(
        sdk.completions.create(
            model=TINY_ID, prompt="hello world", max_tokens=5, temperature=0, logprobs=2, stream=True
        )
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []]
    assert streamed == logprobs.tokens
    assert sdk.completions.create(model=TINY_ID, prompt="hello", max_tokens=2).choices[0].logprobs is None
