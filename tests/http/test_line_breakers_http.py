"""U+2028, U+2029 and U+0085 on every surface, read the way line-splitting clients read.

httpx's `iter_lines` (like many SSE readers) splits at these three as well as at CR and LF, so a
raw one inside an event's JSON cuts the event in half, and inside a body cuts the body. Every byte
the service sends goes through `http.wire_json`, which escapes them. Here they reach the bytes
every way they can: the model's id (an Ollama model may be named anything; every answer echoes
it), the model's output (a generated model that says little but a token made of the three), a
completion's echoed prompt, and an error message quoting what the client sent. Each answer is
read line by line: every line must parse and the text must come back whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from discovery_support import ollama_blob, ollama_manifest
from support import LiveDaemon, start_daemon, wait_task

BREAKERS = "\u2028\u2029\x85"
MODEL = f"odd{BREAKERS}name:latest"  # an Ollama model's id is its name, as Ollama shows it
MAX_TOKENS = 4

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDaemon]:
    """A service whose one model is an Ollama model named with the three characters, and that answers with
    a token made of them (a strong bias towards it)."""
    root = tmp_path_factory.mktemp("breakers")
    store = root / "user" / "ollama"
    digest = ollama_blob(store, user_defined=[BREAKERS], logit_bias={BREAKERS: 60.0}, output_scale=0.1)
    ollama_manifest(store, f"registry.ollama.ai/library/odd{BREAKERS}name/latest", digest)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LMSP_TRAY_HOME", str(root / "home"))
        env.setenv("HOME", str(root / "user"))
        env.setenv("OLLAMA_MODELS", str(store))
        env.delenv("XDG_CACHE_HOME", raising=False)
        env.delenv("LLAMA_CACHE", raising=False)
        (root / "empty").mkdir()
        daemon = start_daemon(root / "empty", default_dirs=True)
        try:
            yield daemon
        finally:
            daemon.stop()


@pytest.fixture
def lmsp(live: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c:
        yield c


@pytest.fixture
def openai(live: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as c:
        yield c


def one_line(r: httpx.Response) -> Any:
    """A JSON body read by lines: one line, which parses."""
    lines = list(r.iter_lines())
    assert len(lines) == 1, f"the body splits into {len(lines)} lines: {lines!r}"
    return json.loads(lines[0])


def sse(r: httpx.Response) -> list[tuple[str | None, Any]]:
    """An event stream read by lines: (event name or None, data) for each event; every line is a field
    the stream uses, every `data:` line parses (`[DONE]` stays a string)."""
    assert r.status_code == 200, r.read()
    out: list[tuple[str | None, Any]] = []
    name: str | None = None
    for line in r.iter_lines():
        if not line or line.startswith(":"):
            name = None if not line else name
            continue
        field, _, value = line.partition(": ")
        assert field in ("id", "event", "data"), f"a line cut from an event: {line!r}"
        if field == "event":
            name = value
        elif field == "data":
            out.append((name, value if value == "[DONE]" else json.loads(value)))
    return out


def output_text(response: dict[str, Any]) -> str:
    return "".join(p["text"] for item in response["output"] if item["type"] == "message" for p in item["content"])


def said(text: str) -> None:
    """The model's text: the token made of the three characters, and nothing else."""
    assert text and text.replace(BREAKERS, "") == "", repr(text)


def ask(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hi", "max_output_tokens": MAX_TOKENS, "temperature": 0, **extra}


def test_lmsp_responses_streamed(lmsp: httpx.Client) -> None:
    with lmsp.stream("POST", "/responses", json=ask(stream=True)) as r:
        events = sse(r)
    deltas = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    said(deltas)
    last = events[-1][1]["response"]
    assert last["model"] == MODEL and output_text(last) == deltas


def test_lmsp_responses_and_listings(lmsp: httpx.Client) -> None:
    response = one_line(lmsp.post("/responses", json=ask(store=True)))
    assert response["model"] == MODEL
    said(output_text(response))
    assert one_line(lmsp.get(f"/responses/{response['id']}")) == response
    assert MODEL in [m["id"] for m in one_line(lmsp.get("/models"))["data"]]
    assert one_line(lmsp.get(f"/models/{MODEL}"))["id"] == MODEL


def test_lmsp_task_events(lmsp: httpx.Client) -> None:
    r = lmsp.post("/tasks", json=ask(stream=True, input=f"say{BREAKERS}it"))
    assert r.status_code == 202, r.text
    task = one_line(r)
    wait_task(lmsp, task["id"], {"completed", "incomplete"})
    with lmsp.stream("GET", f"/tasks/{task['id']}/events") as events:
        said("".join(data["delta"] for name, data in sse(events) if name == "response.output_text.delta"))


def test_v1_chat_completions(openai: httpx.Client) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS, "temperature": 0}
    done = one_line(openai.post("/chat/completions", json=chat))
    assert done["model"] == MODEL
    said(done["choices"][0]["message"]["content"])
    with openai.stream("POST", "/chat/completions", json={**chat, "stream": True}) as r:
        chunks = sse(r)
    assert chunks[-1] == (None, "[DONE]")
    assert {c["model"] for _, c in chunks[:-1]} == {MODEL}
    said("".join(c["choices"][0]["delta"].get("content") or "" for _, c in chunks[:-1] if c["choices"]))


def test_v1_completions_streamed_with_its_prompt_echoed(openai: httpx.Client) -> None:
    prompt = f"one{BREAKERS}two"
    body = {"model": MODEL, "prompt": prompt, "echo": True, "max_tokens": MAX_TOKENS, "temperature": 0}
    with openai.stream("POST", "/completions", json={**body, "stream": True}) as r:
        chunks = sse(r)
    assert chunks[-1] == (None, "[DONE]")
    text = "".join(c["choices"][0]["text"] for _, c in chunks[:-1] if c["choices"])
    assert text.startswith(prompt)
    said(text.removeprefix(prompt))


def test_v1_responses_streamed(openai: httpx.Client) -> None:
    with openai.stream("POST", "/responses", json=ask(stream=True, store=False)) as r:
        events = sse(r)
    assert all(data["type"] == name for name, data in events)
    said("".join(data["delta"] for name, data in events if name == "response.output_text.delta"))
    assert events[-1][1]["response"]["model"] == MODEL


def test_v1_responses_and_stored_items(openai: httpx.Client) -> None:
    response = one_line(openai.post("/responses", json=ask(input=f"in{BREAKERS}put")))
    said(output_text(response))
    assert one_line(openai.get(f"/responses/{response['id']}"))["id"] == response["id"]
    items = one_line(openai.get(f"/responses/{response['id']}/input_items"))["data"]
    assert items[0]["content"][0]["text"] == f"in{BREAKERS}put"


def test_v1_models(openai: httpx.Client) -> None:
    assert MODEL in [m["id"] for m in one_line(openai.get("/models"))["data"]]
    assert one_line(openai.get(f"/models/{MODEL}"))["id"] == MODEL


def test_v1_error_body_quoting_the_request(openai: httpx.Client) -> None:
    name = f"tool{BREAKERS}name"
    messages = [{"role": "function", "name": name, "content": "x"}]
    r = openai.post("/chat/completions", json={"model": MODEL, "messages": messages})
    assert r.status_code == 400
    error = one_line(r)["error"]
    assert error["param"] == "messages[0]" and f"'{name}'" in error["message"]
