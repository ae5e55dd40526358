"""`POST /v1/chat/completions` with the official openai SDK against real llama.cpp on generated models.

Sync and streamed answers, `stream_options.include_usage`, tools (auto / required / named, the
tool message sent back), `response_format` json_object and json_schema (`chat.completions.parse`
with a pydantic model), reasoning in `reasoning_content`, finish reasons, and OpenAI's error object
(NotFoundError, BadRequestError, AuthenticationError).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from gguf_factory import write_tiny_gguf
from pydantic import BaseModel, Field
from support import SLOW_ID, TINY_ID, LiveDaemon, assert_streams_decode_together
from tools_support import FORMAT_CHECKER, LLAMA_ID, QWEN_ID, R1_ID

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
BOOK = {
    "type": "function",
    "function": {
        "name": "book_table",
        "description": "Book a table.",
        "parameters": {
            "type": "object",
            "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12}},
            "required": ["people"],
        },
    },
}
TOOLS = [WEATHER, BOOK]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def live_files(tmp_path_factory: pytest.TempPathFactory, family_models: list[Path], tiny_gguf: Path) -> list[Path]:
    long_tiny = tmp_path_factory.mktemp("long") / "long-tiny.gguf"
    return [*family_models, tiny_gguf, write_tiny_gguf(long_tiny, basename="long-tiny", context_length=32768)]


@pytest.fixture(scope="module")
def live_config() -> dict[str, Any]:
    return {"parallel": 2, "threads": 1}


@pytest.fixture(scope="module")
def sdk(live: LiveDaemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0, timeout=120) as client:
        yield client


def hi(**extra: Any) -> dict[str, Any]:
    return {"model": TINY_ID, "messages": [{"role": "user", "content": "Say hi"}], "temperature": 0, **extra}


def check_call(call: Any) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name], format_checker=FORMAT_CHECKER)
    return args


def test_sync_completion(sdk: openai.OpenAI) -> None:
    done = sdk.chat.completions.create(**hi(max_tokens=6))
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    assert done.model == TINY_ID and done.created > 0
    (choice,) = done.choices
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.message.role == "assistant" and choice.message.content
    assert done.usage is not None and done.usage.completion_tokens == 6
    assert done.usage.prompt_tokens > 0 and done.usage.total_tokens == done.usage.prompt_tokens + 6
    # The same request again reuses the prompt from the KV cache, and says so.
    again = sdk.chat.completions.create(**hi(max_tokens=6))
    assert again.choices[0].message.content == choice.message.content
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    # max_completion_tokens, system and developer roles, content as parts, a stop sequence
    text = choice.message.content
    stop = text[2:4]
    parts = sdk.chat.completions.create(
        model=TINY_ID,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Plain words."}]},
            {"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": " hi"}]},
        ],
        max_completion_tokens=6,
        temperature=0,
        seed=-5,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        stop=[stop],
    )
    assert parts.choices[0].finish_reason in {"stop", "length"}


def test_stream_with_usage_and_done(sdk: openai.OpenAI, live: LiveDaemon) -> None:
    whole = sdk.chat.completions.create(**hi(max_tokens=8)).choices[0].message.content
    chunks = list(sdk.chat.completions.create(**hi(max_tokens=8), stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    # Without include_usage: no usage chunk; the wire ends with data: [DONE] and has no ids or event names.
    with (
        httpx.Client(timeout=120, headers=live.auth_headers) as c,
        c.stream("POST", live.base + "/v1/chat/completions", json=hi(max_tokens=4, stream=True)) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    data = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(d["choices"] for d in data) and all("usage" not in d for d in data)


def test_tools_round_trip(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    done = sdk.chat.completions.create(
        model=QWEN_ID, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=300, seed=1
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls
    for call in calls:
        check_call(call)
    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"temp": 21}'} for c in calls]
    after = sdk.chat.completions.create(model=QWEN_ID, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert after.choices[0].message.tool_calls is None
    assert after.choices[0].finish_reason in {"stop", "length"}
    # A tool result for no earlier call is a 400 naming the message.
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(
            model=QWEN_ID, messages=[*messages[:1], {"role": "tool", "tool_call_id": "nope", "content": "x"}]
        )


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID])
def test_streamed_tool_call_deltas(sdk: openai.OpenAI, model: str) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(3):
        chunks = list(
            sdk.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=TOOLS,
                tool_choice=named,
                max_tokens=300,
                seed=seed,
                stream=True,
            )
        )
        calls: dict[int, dict[str, Any]] = {}
        for chunk in chunks:
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = calls.setdefault(delta.index, {"id": None, "name": None, "args": ""})
                if delta.id is not None:
                    assert entry["id"] is None, "id sent twice"
                    entry["id"] = delta.id
                if delta.function and delta.function.name:
                    assert entry["name"] is None, "name sent twice"
                    entry["name"] = delta.function.name
                if delta.function and delta.function.arguments:
                    entry["args"] += delta.function.arguments
        assert calls and sorted(calls) == list(range(len(calls)))
        for entry in calls.values():
            assert entry["id"].startswith("call_") and entry["name"] == "get_weather"
            jsonschema.validate(json.loads(entry["args"]), SCHEMAS["get_weather"])
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tool_choice_text_or_valid_calls(sdk: openai.OpenAI) -> None:
    for seed in range(4):
        done = sdk.chat.completions.create(
            model=QWEN_ID,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=TOOLS,
            max_tokens=300,
            seed=seed,
            temperature=1.0,
        )
        choice = done.choices[0]
        for call in choice.message.tool_calls or []:
            check_call(call)
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"


class Booking(BaseModel):
    people: int = Field(ge=1, le=12)
    name: str = Field(max_length=12)
    vip: bool


def test_parse_with_a_pydantic_model(sdk: openai.OpenAI) -> None:
    for seed in range(3):
        done = sdk.chat.completions.parse(
            model=PLAIN,
            messages=[{"role": "user", "content": "Book for two."}],
            response_format=Booking,
            max_tokens=300,
            seed=seed,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Booking)


PLAIN = "plain-tiny:1m-f32"


class Ticket(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{2}-\d{3}$")
    tag: str = Field(pattern=r"^#[a-z]{1,8}$", max_length=9)


def test_parse_with_constrained_strings(sdk: openai.OpenAI) -> None:
    """pydantic's `pattern` reaches the grammar (it was refused with 400 before)."""
    for seed in range(3):
        done = sdk.chat.completions.parse(
            model=PLAIN,
            messages=[{"role": "user", "content": "A ticket."}],
            response_format=Ticket,
            max_tokens=300,
            seed=seed,
            temperature=1.0,
        )
        parsed = done.choices[0].message.parsed
        assert isinstance(parsed, Ticket), done.choices[0]


def test_json_object(sdk: openai.OpenAI) -> None:
    done = sdk.chat.completions.create(
        model=PLAIN,
        messages=[{"role": "user", "content": "JSON please"}],
        response_format={"type": "json_object"},
        max_tokens=300,
        seed=2,
    )
    assert done.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(done.choices[0].message.content or ""), dict)


def test_reasoning_content_is_apart(sdk: openai.OpenAI) -> None:
    done = sdk.chat.completions.create(
        model=R1_ID, messages=[{"role": "user", "content": "Think first."}], max_tokens=200, seed=3
    )
    message = done.choices[0].message.model_dump()
    assert message.get("reasoning_content"), message
    assert not (message["content"] or "").startswith(message["reasoning_content"])  # not mixed into the content
    chunks = list(
        sdk.chat.completions.create(
            model=R1_ID, messages=[{"role": "user", "content": "Think first."}], max_tokens=200, seed=3, stream=True
        )
    )
    thought = "".join((c.choices[0].delta.model_dump().get("reasoning_content") or "") for c in chunks if c.choices)
    assert thought == message["reasoning_content"]


LONG_ID = "long-tiny:1m-f32"


def test_default_context_fits_an_agents_first_request(sdk: openai.OpenAI) -> None:
    """Without context_cap the window is sized from memory (this model's KV cache is tiny, so it gets
    its whole trained 32k, not the old fixed 8k), the listing says so, and a ~9,000-token request runs."""
    listed = {m.id: m.model_dump() for m in sdk.models.list()}
    assert listed[LONG_ID]["context_length"] == 32768
    assert listed[TINY_ID]["context_length"] == 512  # never past the trained length
    done = sdk.chat.completions.create(
        model=LONG_ID, messages=[{"role": "user", "content": "hello world " * 800}], max_tokens=2, temperature=0
    )
    assert done.usage is not None and done.usage.prompt_tokens > 9000
    assert sdk.models.retrieve(LONG_ID).model_dump()["context_length"] == 32768  # loaded: the same window


TWO_PIXELS = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII="
)


def test_errors_in_openai_shape(sdk: openai.OpenAI, live: LiveDaemon, closing: Callable) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found" and "no-such-model" in missing.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(**hi(n=2))
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(**hi(temperature=7))
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(
            model=TINY_ID,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": TWO_PIXELS}}]}],
        )  # a model without a vision projector
    assert bad.value.code == "unsupported_capability" and bad.value.param == "messages[0].content[0]"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=TINY_ID, messages=[{"role": "wizard", "content": "hi"}])
    assert bad.value.param == "messages[0]"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=TINY_ID, messages=[])
    assert bad.value.param == "messages"
    nobody = closing(openai.OpenAI(base_url=live.base + "/v1", api_key="lmsp_wrong", max_retries=0))
    with pytest.raises(openai.AuthenticationError):
        nobody.chat.completions.create(**hi())
    r = httpx.post(live.base + "/v1/chat/completions", content=b"{", headers=live.auth_headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json" and "Traceback" not in r.text


def test_idempotency_key_replays(live: LiveDaemon) -> None:
    headers = {**live.auth_headers, "Idempotency-Key": "chat-key-1"}
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=headers) as c:
        first = c.post("/chat/completions", json=hi(max_tokens=5, temperature=1.0))
        again = c.post("/chat/completions", json=hi(max_tokens=5, temperature=1.0))
    assert first.status_code == again.status_code == 200
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.json() == first.json()


def test_four_v1_streams_decode_together(daemon_factory: Any) -> None:
    """Batching holds on /v1: four concurrent chat streams equal their solo output and share decode steps."""
    live = daemon_factory(parallel=4)
    with openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0, timeout=120) as sdk:

        def run(prompt: str) -> str:
            chunks = sdk.chat.completions.create(
                model=SLOW_ID, messages=[{"role": "user", "content": prompt}], max_tokens=40, temperature=0, stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        assert_streams_decode_together(live, run)


def test_logprobs_from_the_models_logits(sdk: openai.OpenAI, live: LiveDaemon) -> None:
    """`logprobs`/`top_logprobs` are the model's own: the first token's equal llama.cpp's softmax over the
    logits of the same prompt, computed here in process; greedy picks are the top alternative."""
    done = sdk.chat.completions.create(**hi(max_tokens=6), logprobs=True, top_logprobs=3)
    choice = done.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert len(entries) == 6
    assert b"".join(bytes(e.bytes or []) for e in entries).decode(errors="replace") == choice.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert bytes(e.bytes or []).decode(errors="replace") == e.token
    # The same prompt's first-token distribution from llama.cpp itself.
    from llama_cpp import Llama

    path = live.service.catalog.resolve(TINY_ID).path
    llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False)
    prompt = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    assert done.usage is not None and done.usage.prompt_tokens == len(tokens)
    llm.eval(tokens)
    logits = [float(x) for x in llm.scores[len(tokens) - 1]]
    peak = max(logits)
    import math

    total = peak + math.log(sum(math.exp(x - peak) for x in logits))
    ranked = sorted(range(len(logits)), key=lambda i: -logits[i])[:3]
    # (the service's context batches differently, so the last digits may differ)
    for alt, i in zip(entries[0].top_logprobs, ranked, strict=True):
        assert abs(alt.logprob - (logits[i] - total)) < 0.01
    # Streamed chunks carry the same entries; without logprobs there are none.
    chunks = list(sdk.chat.completions.create(**hi(max_tokens=6), logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]
    assert sdk.chat.completions.create(**hi(max_tokens=2)).choices[0].logprobs is None
