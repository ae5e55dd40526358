"""The Ollama-compatible API, driven by Ollama's official Python client against a live daemon.

Real parts: the `ollama` package from PyPI, the service over a loopback socket, llama.cpp on
generated GGUFs (the tiny and slow test models, a fill-in-the-middle model, a BERT embedding
model), the fake Hub for pulls. What an app sees: the listing, a model's details, loaded models,
chat and generate streamed and not, tools, JSON Schema output, embeddings, pulls, Ollama's errors,
the keyless refusal that names its setting, and the opt-in second listener.

`options.num_ctx` caps a request's window and never reloads the model (what was chosen): the service
sizes each model's window at load, from memory (`context_cap`), and shares it between every request and
client, where Ollama reloads a model whose num_ctx changes. A num_ctx below the model's window holds the
prompt and the output together within it (the output stops there, `done_reason` "length"; a prompt that
does not fit is refused naming num_ctx); a larger one is served with the model's own window, without a
reload (`/api/ps` and `/api/show` give that window).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from gguf_factory import write_tiny_bert_gguf, write_tiny_gguf
from hub_server import FakeHub
from hub_support import TINY, fake_hub, hf_env, home, hub  # noqa: F401
from pydantic import BaseModel
from support import SLOW_ID, TINY_ID, LiveDaemon, assert_streams_decode_together, start_daemon
from tools_support import QWEN_ID, R1_ID, write_family_models

pytestmark = pytest.mark.timeout(300)

FIM_ID = "fim-meta:1m-f32"
NUM_CTX_MESSAGES = [{"role": "user", "content": "hello there"}]
EMBED_FILE = "tiny-embed-1m-f32.gguf"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path, slow_gguf: Path) -> Path:
    folder = tmp_path_factory.mktemp("ollama-models")
    for model in (tiny_gguf, slow_gguf):
        (folder / model.name).symlink_to(model)
    write_tiny_gguf(folder / "fim-meta.gguf", basename="fim-meta", fim="metadata", seed=7)
    write_tiny_bert_gguf(folder / EMBED_FILE)
    write_family_models(folder)  # Qwen3's template: tools and thinking
    return folder


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, models: Path) -> Iterator[LiveDaemon]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(tmp_path_factory.mktemp("home")))
        daemon = start_daemon(models, parallel=4, threads=1, max_loaded_models=4)
        try:
            yield daemon
        finally:
            daemon.stop()


@pytest.fixture(scope="module")
def client(live: LiveDaemon) -> Iterator[ollama.Client]:
    with ollama.Client(host=live.base, headers=live.auth_headers, timeout=120) as c:
        yield c


def _embed_id(client: ollama.Client) -> str:
    return next(m.model for m in client.list().models if m.model and m.model.startswith("tiny-embed"))


def test_probe_version_and_listing(live: LiveDaemon, client: ollama.Client) -> None:
    probe = httpx.get(live.base + "/", timeout=30)
    assert probe.status_code == 200 and probe.text == "Ollama is running"
    assert httpx.get(live.base + "/api/version", timeout=30).json()["version"]
    listing = client.list().models
    names = {m.model for m in listing}
    assert {TINY_ID, SLOW_ID, FIM_ID} <= names
    tiny = next(m for m in listing if m.model == TINY_ID)
    assert tiny.details is not None and tiny.details.format == "gguf" and tiny.details.family == "llama"
    assert tiny.details.quantization_level == "F32" and tiny.size and tiny.size > 0
    assert tiny.digest and len(tiny.digest) == 64 and tiny.modified_at is not None
    raw = httpx.get(live.base + "/api/tags", headers=live.auth_headers, timeout=30).json()["models"]
    assert all(m["name"] == m["model"] for m in raw)


def test_show_and_ps(client: ollama.Client) -> None:
    shown = client.show(TINY_ID)
    assert shown.capabilities is not None and {"completion", "tools"} <= set(shown.capabilities)
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    assert "insert" in (client.show(FIM_ID).capabilities or [])
    assert client.show(_embed_id(client)).capabilities == ["embedding"]
    client.generate(model=TINY_ID, prompt="", keep_alive="10m")  # an empty prompt loads the model
    loaded = {m.model: m for m in client.ps().models}
    assert TINY_ID in loaded and loaded[TINY_ID].expires_at is not None and loaded[TINY_ID].size
    assert loaded[TINY_ID].context_length and loaded[TINY_ID].context_length > 0
    unloaded = client.generate(model=TINY_ID, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert TINY_ID not in {m.model for m in client.ps().models}


def test_chat_streamed_and_not_agree(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    options = {"temperature": 0, "num_predict": 12, "mirostat": 0}  # an unknown option is ignored
    whole = client.chat(model=TINY_ID, messages=messages, options=options, stream=False)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    assert whole.prompt_eval_count and whole.total_duration and whole.eval_duration is not None
    assert whole.total_duration >= (whole.load_duration or 0) + (whole.eval_duration or 0)
    parts = list(client.chat(model=TINY_ID, messages=messages, options=options, stream=True))
    assert parts[-1].done and parts[-1].done_reason == "length" and parts[-1].eval_count == 12
    assert all(not p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    stopped = client.chat(model=TINY_ID, messages=messages, options={**options, "stop": [whole.message.content[2:4]]})
    assert stopped.done_reason == "stop" and len(stopped.message.content or "") < len(whole.message.content or "")


def test_generate_templated_raw_and_fill_in_the_middle(client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 8}
    templated = client.generate(model=TINY_ID, prompt="hello", system="Be brief.", options=options)
    assert templated.done and templated.eval_count == 8 and templated.response
    raw = client.generate(model=TINY_ID, prompt="hello", raw=True, options=options)
    assert raw.done and raw.prompt_eval_count is not None
    assert raw.prompt_eval_count < (templated.prompt_eval_count or 0)  # no template around it
    streamed = "".join(
        p.response
        for p in client.generate(model=TINY_ID, prompt="hello", system="Be brief.", options=options, stream=True)
    )
    assert streamed == templated.response
    fim = client.generate(model=FIM_ID, prompt="def f():\n    return ", suffix="\n", options=options)
    plain = client.generate(model=FIM_ID, prompt="def f():\n    return ", raw=True, options=options)
    assert fim.done and fim.prompt_eval_count and plain.prompt_eval_count
    assert fim.prompt_eval_count > plain.prompt_eval_count  # the FIM tokens and the suffix went in
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model=TINY_ID, prompt="hello", template="{{ .Prompt }}")
    assert refused.value.status_code == 400 and "template" in refused.value.error


class Weather(BaseModel):
    city: str
    degrees: int


def test_format_with_a_pydantic_schema_and_json(client: ollama.Client) -> None:
    answer = client.chat(
        model=TINY_ID,
        messages=[{"role": "user", "content": "weather?"}],
        format=Weather.model_json_schema(),
        options={"temperature": 0, "num_predict": 200},
    )
    Weather.model_validate_json(answer.message.content or "")
    loose = client.generate(model=TINY_ID, prompt="json", format="json", options={"num_predict": 200, "seed": 3})
    assert isinstance(json.loads(loose.response), dict)


def test_tools_round_trip(client: ollama.Client) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 24}},
                "required": ["city"],
            },
        },
    }
    messages: list = [{"role": "user", "content": "Weather in Paris?"}]
    first = None
    for seed in range(8):  # a random-weight model calls the tool for some seeds, answers for others
        first = client.chat(
            model=QWEN_ID, messages=messages, tools=[tool], options={"seed": seed, "num_predict": 300, "temperature": 1}
        )
        if first.message.tool_calls:
            break
    assert first is not None and first.message.tool_calls, "no seed made the model call the tool"
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    assert isinstance(call.function.arguments.get("city"), str)
    messages += [first.message, {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"}]
    second = client.chat(model=QWEN_ID, messages=messages, tools=[tool], options={"num_predict": 6, "temperature": 0})
    assert second.done and second.prompt_eval_count and second.prompt_eval_count > (first.prompt_eval_count or 0)


def test_think_puts_the_reasoning_in_message_thinking(client: ollama.Client) -> None:
    asked = [{"role": "user", "content": "Think first."}]
    thought = client.chat(model=R1_ID, messages=asked, think=True, options={"num_predict": 200, "seed": 3})
    assert thought.message.thinking and not (thought.message.content or "").startswith(thought.message.thinking)
    parts = client.chat(model=R1_ID, messages=asked, think=True, options={"num_predict": 200, "seed": 3}, stream=True)
    assert "".join(p.message.thinking or "" for p in parts) == thought.message.thinking
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=TINY_ID, messages=asked, think=True)
    assert refused.value.status_code == 400


def test_embed_with_truncate(client: ollama.Client) -> None:
    model = _embed_id(client)
    out = client.embed(model=model, input=["hello world", "zebra quux"])
    assert len(out.embeddings) == 2 and len(out.embeddings[0]) > 0
    assert abs(sum(x * x for x in out.embeddings[0]) - 1) < 1e-3  # L2-normalised, as Ollama's /api/embed
    legacy = client.embeddings(model=model, prompt="hello world")
    assert legacy.embedding == pytest.approx(out.embeddings[0], abs=1e-5)
    long = "word " * 5000  # far past the tiny BERT's window
    cut = client.embed(model=model, input=long)
    assert len(cut.embeddings) == 1
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=model, input=long, truncate=False)
    assert refused.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as not_embedding:
        client.embed(model=TINY_ID, input="hello")
    assert not_embedding.value.status_code == 400


def test_errors_in_ollamas_shape(live: LiveDaemon, client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "not found" in missing.value.error
    with pytest.raises(ollama.ResponseError) as ambiguous:
        client.show("fim-meta:nope")
    assert ambiguous.value.status_code == 404
    for call in (lambda: client.copy(TINY_ID, "other"), lambda: client.push("x")):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 400 and "not" in refused.value.error
    with pytest.raises(ollama.ResponseError) as theirs:  # a file in the person's own folder: never deleted
        client.delete(TINY_ID)
    assert theirs.value.status_code == 409 and "never deletes it" in theirs.value.error
    assert TINY_ID in {m.model for m in client.list().models}
    r = httpx.post(live.base + "/api/chat", json={"model": TINY_ID}, headers={"Host": "evil.example"}, timeout=30)
    assert r.status_code == 403 and set(r.json()) == {"error"}


def test_a_failure_after_the_first_line_is_a_last_error_line(live: LiveDaemon, client: ollama.Client) -> None:
    parts = client.chat(
        model=SLOW_ID, messages=[{"role": "user", "content": "go"}], options={"num_predict": 3000}, stream=True
    )
    first = next(parts)
    assert not first.done
    threading.Thread(target=live.daemon.models.unload, args=(SLOW_ID,), kwargs={"drain": False}).start()
    with pytest.raises(ollama.ResponseError) as failed:
        for _ in parts:
            pass
    assert failed.value.error  # the last line was {"error": "..."}, which the client raises


def test_a_name_without_its_tag_is_the_one_model_of_that_name(client: ollama.Client) -> None:
    done = client.generate(model="fim-meta", prompt="hi", options={"num_predict": 2})
    assert done.done and done.model == "fim-meta"


def test_four_chat_streams_decode_together(live: LiveDaemon, client: ollama.Client) -> None:
    """Batching holds on /api/chat: four concurrent streams equal their solo output and share decode steps."""

    def run(prompt: str) -> str:
        parts = client.chat(
            model=SLOW_ID,
            messages=[{"role": "user", "content": prompt}],
            options={"temperature": 0, "num_predict": 40},
            stream=True,
        )
        return "".join(p.message.content or "" for p in parts)

    assert_streams_decode_together(live, run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_keyless_refused_naming_the_setting_then_served_and_the_second_listener(
    daemon_factory, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    port = _free_port()
    live = daemon_factory(ollama_port=port)
    assert live.daemon.ollama_url == f"http://127.0.0.1:{port}"
    keyless = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=60)
    request.addfinalizer(keyless.close)
    assert httpx.get(f"http://localhost:{port}/", timeout=30).text == "Ollama is running"
    with pytest.raises(ollama.ResponseError) as refused:
        keyless.list()
    assert refused.value.status_code == 401 and "keyless_scopes" in refused.value.error
    assert "Apps without a token" in refused.value.error
    live.daemon.apply_settings({"keyless_scopes": ["models:read", "responses:create"]})
    assert TINY_ID in {m.model for m in keyless.list().models}
    answer = keyless.chat(model=TINY_ID, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3})
    assert answer.done and answer.eval_count == 3


def test_a_taken_ollama_port_is_left_alone(daemon_factory) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        live = daemon_factory(ollama_port=port)
        assert live.daemon.ollama_url is None
        assert live.daemon.ollama_refused and f"Port {port} (ollama_port) is taken" in live.daemon.ollama_refused
        assert httpx.get(live.base + "/", timeout=30).text == "Ollama is running"  # still on the own port


def test_pull_from_the_fake_hub(daemon_factory, home: Path, hub: FakeHub, request: pytest.FixtureRequest) -> None:
    live = daemon_factory(default_dirs=True)
    live.daemon.downloads.progress_every = 0.0
    client = ollama.Client(host=live.base, headers=live.auth_headers, timeout=120)
    request.addfinalizer(client.close)
    name = f"hf.co/{TINY}:Q4_K_M"
    lines = list(client.pull(name, stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    progress = [p for p in lines if p.digest]
    assert progress and all(p.digest.startswith("sha256:") and p.total for p in progress)
    assert progress[-1].completed == progress[-1].total
    done = client.generate(model=name, prompt="hello", options={"num_predict": 3})  # the name pulled runs
    assert done.done and done.eval_count == 3
    assert client.pull(name, stream=False).status == "success"  # already there: done at once
    with pytest.raises(ollama.ResponseError) as missing:
        client.pull("hf.co/test-org/No-Such-GGUF", stream=False)
    assert missing.value.status_code == 404
    # What the service pulled, it deletes (its revision, as huggingface_hub removes one); then it is gone.
    pulled = {m.model for m in client.list().models}
    assert client.delete(name).status == "success"
    assert len({m.model for m in client.list().models}) == len(pulled) - 1
    with pytest.raises(ollama.ResponseError) as gone:
        client.show(name)
    assert gone.value.status_code == 404


# -- num_ctx -------------------------------------------------------------------------------------
def test_a_smaller_num_ctx_holds_prompt_and_output_within_it(client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 40}
    whole = client.chat(model=TINY_ID, messages=NUM_CTX_MESSAGES, options=options)
    prompt = whole.prompt_eval_count
    assert prompt and whole.eval_count == 40 and whole.done_reason == "length"
    capped = client.chat(model=TINY_ID, messages=NUM_CTX_MESSAGES, options={**options, "num_ctx": prompt + 6})
    assert capped.prompt_eval_count == prompt and capped.eval_count == 6 and capped.done_reason == "length"
    assert whole.message.content.startswith(capped.message.content)  # the same greedy answer, cut at num_ctx
    streamed = list(client.generate(model=TINY_ID, prompt="hello", options={**options, "num_ctx": 30}, stream=True))
    last = streamed[-1]
    assert last.done and last.done_reason == "length" and (last.prompt_eval_count or 0) + (last.eval_count or 0) == 30


def test_a_prompt_longer_than_num_ctx_is_refused_naming_it(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=TINY_ID, messages=NUM_CTX_MESSAGES, options={"num_ctx": 4})
    assert refused.value.status_code == 400
    assert "this request's num_ctx is 4 tokens" in refused.value.error and f"'{TINY_ID}' has " in refused.value.error


def test_a_larger_num_ctx_is_served_with_the_models_window_without_a_reload(
    live: LiveDaemon, client: ollama.Client
) -> None:
    client.generate(model=TINY_ID, prompt="", keep_alive="10m")  # loaded
    window = next(m for m in client.ps().models if m.model == TINY_ID).context_length
    loaded = live.daemon.models.get(TINY_ID)
    assert window and loaded is not None
    answer = client.chat(
        model=TINY_ID, messages=NUM_CTX_MESSAGES, options={"temperature": 0, "num_predict": 8, "num_ctx": 10 * window}
    )
    assert answer.eval_count == 8 and answer.done_reason == "length"
    assert live.daemon.models.get(TINY_ID) is loaded  # the same model process: no reload for a larger num_ctx
    assert next(m for m in client.ps().models if m.model == TINY_ID).context_length == window
