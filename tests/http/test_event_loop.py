"""Nothing slow on the event loop: a big body is decoded, validated and checked while others are served.

The ordering tests hold the work on its worker thread until the loop has answered other requests: if the work
ran on the loop, nothing else could be answered meanwhile and the test fails (after a bounded wait), whatever
the machine's speed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, Self

import httpx
import pytest
from support import TINY_ID, LiveDaemon, body

from lmsp_tray.engine.templates import RenderedPast
from lmsp_tray.http import routes
from lmsp_tray.serving import service as service_module
from lmsp_tray.serving.input_bounds import PROBE_SLACK_TOKENS, token_floor

ANSWERS_WHILE_HELD = 3
HOLD_LIMIT_S = 60.0


def history(size: int) -> dict[str, Any]:
    """A request whose input is a conversation of about `size` bytes (thousands of messages)."""
    text = "the keeper climbs the stairs and lights the lamp " * 4
    n = size // (len(text) + 40)
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"} for i in range(n)]
    return body(items)


class Probes:
    """A client asking for the service document in a loop, counting the answers after `mark()`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.marked = threading.Event()
        self.enough = threading.Event()  # `ANSWERS_WHILE_HELD` answers came after the mark
        self.after_mark = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=HOLD_LIMIT_S) as c:
            while not self.stop.is_set():
                marked = self.marked.is_set()  # read before asking: the answer certainly came after the mark
                assert c.get(self.url).status_code == 200
                if marked:
                    self.after_mark += 1
                    if self.after_mark >= ANSWERS_WHILE_HELD:
                        self.enough.set()

    def mark(self) -> None:
        self.marked.set()

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(HOLD_LIMIT_S)


def holding(real: Callable[..., Any], probes: Probes, held: list[bool]) -> Callable[..., Any]:
    """`real`, but a call first waits until the probes were answered while it runs (records whether they were)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        probes.mark()
        held.append(probes.enough.wait(HOLD_LIMIT_S))
        return real(*args, **kwargs)

    return wrapper


@pytest.fixture
def probes(daemon: LiveDaemon) -> Iterator[Probes]:
    with Probes(daemon.url) as p:
        yield p


def test_a_large_body_is_decoded_while_the_loop_answers_others(
    daemon: LiveDaemon, client: httpx.Client, probes: Probes, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[bool] = []
    monkeypatch.setattr(routes, "PROCESS_BODY_BYTES", 2**62)  # on a thread (test_body_parser: in the worker)
    monkeypatch.setattr(routes, "decode_json", holding(routes.decode_json, probes, held))
    raw = json.dumps(history(3 * 2**20)).encode()
    assert len(raw) > routes.INLINE_BODY_BYTES
    r = client.post("/responses", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text
    assert held == [True], "the service answered nothing else while it decoded the body"


def test_a_large_input_is_rendered_and_tokenized_while_the_loop_answers_others(
    daemon: LiveDaemon, client: httpx.Client, probes: Probes, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[bool] = []
    real = service_module.Service._prompt_tokens
    monkeypatch.setattr(service_module.Service, "_prompt_tokens", holding(real, probes, held))
    r = client.post("/responses", json=body("word " * 5000, max_output_tokens=1))  # 25 kB: large, small body
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text
    assert held == [True], "the service answered nothing else while it rendered and tokenized the input"


def test_a_small_body_is_decoded_on_the_loop_and_its_prompt_tokenized_off_it(
    daemon: LiveDaemon, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small body is decoded on the loop (a hop would count in the time to first token); the prompt is
    rendered and tokenized on a worker thread, since tokenizing is a round trip to the model process."""
    loop_thread: list[int] = []
    decoded: list[int] = []
    tokenized: list[int] = []
    real_read, real_decode, real_tokens = routes.read_body, routes.decode_json, service_module.Service._prompt_tokens

    async def read_body(request: Any) -> bytes:  # a coroutine: runs on the loop
        loop_thread.append(threading.get_ident())
        return await real_read(request)

    def decode(raw: bytes) -> Any:
        decoded.append(threading.get_ident())
        return real_decode(raw)

    def tokens(self: Any, *args: Any) -> Any:
        tokenized.append(threading.get_ident())
        return real_tokens(self, *args)

    monkeypatch.setattr(routes, "read_body", read_body)
    monkeypatch.setattr(routes, "decode_json", decode)
    monkeypatch.setattr(service_module.Service, "_prompt_tokens", tokens)
    assert client.post("/responses", json=body(max_output_tokens=2)).status_code == 200
    assert len(decoded) == 1 and set(decoded) == set(loop_thread)
    assert len(tokenized) == 1 and set(tokenized).isdisjoint(loop_thread)


def count_tokenizing(model: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each text `model` tokenizes as a prompt from now on (the real tokenizer still runs)."""
    tokenized: list[int] = []
    real = model.tokenize_prompt

    def tokenize(text: str, **kwargs: Any) -> list[int]:
        tokenized.append(len(text))
        return real(text, **kwargs)

    monkeypatch.setattr(model, "tokenize_prompt", tokenize)
    return tokenized


def test_a_huge_input_is_refused_without_tokenizing_any_of_it(
    daemon: LiveDaemon, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """7 MiB over the context: refused from its text's length alone (`text_floor`), nothing tokenized;
    just over the window, tokenized whole and the exact count given."""
    r = client.post("/models/" + TINY_ID + "/load")
    assert r.status_code == 200
    model = daemon.daemon.models.get(TINY_ID)
    tokenized = count_tokenizing(model, monkeypatch)
    text = "hello world " * (7 * 2**20 // 12)
    r = client.post("/responses", json=body(text))
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded" and r.json()["param"] == "input"
    least = -(-len(text.strip()) // model.longest_piece())
    assert r.json()["detail"].startswith(f"The input is at least {least} tokens; '{TINY_ID}' has a context window")
    assert least > model.context_length and not tokenized
    # Just over the window: tokenized whole, the exact count is given.
    r = client.post("/responses", json=body("hello world " * 400))
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded"
    assert "is at least" not in r.json()["detail"] and max(tokenized) > 4000  # the whole prompt


def test_a_huge_conversation_of_assistant_turns_is_probed(
    daemon: LiveDaemon, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template may drop an assistant turn's text (its reasoning), so `text_floor` does not count it: a
    conversation huge in its assistant turns only is refused from its rendering's start (`token_floor`)."""
    assert client.post("/models/" + TINY_ID + "/load").status_code == 200
    model = daemon.daemon.models.get(TINY_ID)
    tokenized = count_tokenizing(model, monkeypatch)
    turns = [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": "hello world " * 2**17}]
    r = client.post("/responses", json=body([*turns, {"role": "user", "content": "And?"}]))
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded"
    assert r.json()["detail"].startswith("The input is at least ")
    assert tokenized and max(tokenized) < 64 * 1024  # a prefix of the rendering was tokenized


def test_a_huge_conversation_is_refused_from_the_start_of_its_rendering(
    daemon: LiveDaemon, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of messages far over the context, where their text's length alone proves nothing: the
    template renders only the prompt's start (what `token_floor` reads), and the answer is the one a
    whole rendering gives."""
    assert client.post("/models/" + TINY_ID + "/load").status_code == 200
    model = daemon.daemon.models.get(TINY_ID)
    monkeypatch.setattr(model, "longest_piece", lambda: 2**30)  # its text alone proves nothing (`text_floor`)
    template = model.template
    rendered: list[int] = []
    real = template.render

    def render(messages: Any, **kwargs: Any) -> str:
        try:
            text = real(messages, **kwargs)
        except RenderedPast as past:
            rendered.append(len(past.head))
            raise
        rendered.append(len(text))
        return text

    monkeypatch.setattr(template, "render", render)
    request = history(1024 * 1024)
    r = client.post("/responses", json=request)
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded"
    assert r.json()["detail"].startswith("The input is at least ")
    assert rendered and max(rendered) < 256 * 1024  # the start of a prompt of about a MiB
    real_plan = service_module.build_plan
    monkeypatch.setattr(service_module, "build_plan", lambda *a, at_most=None: real_plan(*a))  # render it whole
    rendered.clear()
    whole = client.post("/responses", json=request)
    assert max(rendered) > 900 * 1024
    assert whole.status_code == 400 and whole.content == r.content


def test_deep_nesting_in_a_large_body_is_refused(client: httpx.Client) -> None:
    raw = json.dumps(history(256 * 1024))[:-1] + ', "metadata": ' + "[" * 65 + "]" * 65 + "}"
    assert len(raw) > routes.INLINE_BODY_BYTES
    r = client.post("/responses", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request" and "nested" in r.json()["detail"]
    r = client.post("/responses", content=raw[:-2], headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_json"


def words(text: str) -> list[int]:
    return [1] * len(text.split())


def test_token_floor() -> None:
    window = 100
    probe = (window + PROBE_SLACK_TOKENS) * 8
    assert token_floor(words, "w " * (probe - 1), window) is None  # not far over: tokenize it whole
    floor = token_floor(words, "w " * (4 * probe), window)
    assert floor is not None and floor >= window
    assert floor <= probe // 2  # counted on a prefix only
    # A prompt of long tokens (here one per 40 characters) may fit after all: no proof, no floor.
    assert token_floor(words, ("x" * 39 + " ") * probe, window) is None
    # A prompt without spaces is cut anywhere.
    assert token_floor(lambda t: [1] * len(t), "x" * (4 * probe), window) == probe - PROBE_SLACK_TOKENS
