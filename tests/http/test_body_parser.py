"""Big bodies are parsed in a worker process (`http.body_parser`): the same objects and the same answers as in
process, and the streams' tokens keep flowing while the worker holds its own interpreter lock."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import gc
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import SLOW_ID, TINY_ID, LiveDaemon

from lmsp_tray.errors import LMSPError
from lmsp_tray.http import routes
from lmsp_tray.http.body_parser import CHUNK_ITEMS, PIPE_BYTES, BodyParser, parse_body, sliced_parse_body
from lmsp_tray.priority import BACKGROUND_NICE
from lmsp_tray.protocol.anthropic import parse_count_tokens, parse_message_create
from lmsp_tray.protocol.embeddings import parse_embedding_create
from lmsp_tray.protocol.ollama_requests import parse_chat, parse_embed, parse_generate, parse_legacy_embed
from lmsp_tray.protocol.openai_chat import parse_chat_create
from lmsp_tray.protocol.openai_completions import parse_completion_create
from lmsp_tray.protocol.openai_requests import parse_openai_response_create
from lmsp_tray.protocol.requests import LARGE_REQUEST_CHARS, parse_response_create

MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "x"},
]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}

# Each parser that reads a body, with a body it accepts and bodies it refuses.
PARSERS: list[tuple[Any, dict[str, Any], list[bytes]]] = [
    (parse_response_create, {"model": "m", "input": "hi", "max_output_tokens": 3}, [b'{"model": 1}']),
    (parse_openai_response_create, {"model": "m", "input": "hi", "tools": [RESPONSES_TOOL]}, [b'{"input": {}}']),
    (parse_chat_create, {"model": "m", "messages": MESSAGES, "tools": [TOOL], "seed": 3}, [b'{"model":"m"}']),
    (parse_completion_create, {"model": "m", "prompt": "once", "max_tokens": 4}, [b'{"model":"m","prompt":7}']),
    (parse_embedding_create, {"model": "m", "input": ["a", "b"]}, [b'{"model":"m","input":{}}']),
    (parse_message_create, {"model": "m", "max_tokens": 5, "messages": MESSAGES}, [b'{"model":"m","messages":3}']),
    (parse_count_tokens, {"model": "m", "messages": MESSAGES}, [b'{"messages":[]}']),
    (parse_chat, {"model": "m", "messages": MESSAGES, "options": {"seed": 1}}, [b'{"model":"m","messages":"x"}']),
    (parse_generate, {"model": "m", "prompt": "hi", "keep_alive": "5m"}, [b'{"model":"m","keep_alive":"soon"}']),
    (parse_embed, {"model": "m", "input": "a"}, [b'{"model":"m","input":5}']),
    (parse_legacy_embed, {"model": "m", "prompt": "a"}, [b'{"model":"m","prompt":[]}']),
]
MALFORMED = [b"{", b'{"a": NaN}', b"[" * 70 + b"]" * 70, b'"\\ud800"', b"\xff"]


def outcome(parse: Any, raw: bytes, bodies: BodyParser | None) -> Any:
    """What parsing `raw` gives: the object, or the problem document of the error (in process without `bodies`)."""
    try:
        return asyncio.run(bodies.parse(parse, raw)) if bodies is not None else parse_body(parse, raw)
    except LMSPError as exc:
        return {"refused": (type(exc), exc.to_problem(), exc.headers)}


def test_a_body_parsed_in_the_worker_gives_the_same_object_or_error() -> None:
    bodies = BodyParser()
    try:
        for parse, good, bad in PARSERS:
            for raw in [json.dumps(good).encode(), *bad, *MALFORMED]:
                here, there = outcome(parse, raw, None), outcome(parse, raw, bodies)
                assert there == here, (parse.__name__, raw[:40])
            assert not isinstance(outcome(parse, json.dumps(good).encode(), bodies), dict), parse.__name__
        # Long lists come back in slices (CHUNK_ITEMS), put together in order.
        long_chat = {
            "model": "m",
            "messages": [{"role": "user", "content": f"m{i}"} for i in range(2 * CHUNK_ITEMS + 7)],
        }
        long_input = {"model": "m", "input": [f"text {i}" for i in range(CHUNK_ITEMS + 1)]}
        for parse, doc in ((parse_chat_create, long_chat), (parse_embedding_create, long_input)):
            raw = json.dumps(doc).encode()
            assert outcome(parse, raw, bodies) == outcome(parse, raw, None), parse.__name__
        assert bodies.started
    finally:
        bodies.close()
    assert not bodies.started
    bodies.close()  # again: nothing to do


# Each API that reads a body: the path, its headers' kind, and bodies whose answers are errors.
APIS = [
    ("/lmsp/v1/responses", {"model": "nope", "input": "hi"}),
    ("/lmsp/v1/tasks", {"model": TINY_ID, "input": 5}),
    ("/v1/responses", {"model": "nope", "input": "hi"}),
    ("/v1/chat/completions", {"model": TINY_ID, "messages": "hi"}),
    ("/v1/completions", {"model": "nope", "prompt": "once"}),
    ("/v1/embeddings", {"model": TINY_ID, "input": {}}),
    ("/v1/messages", {"model": "nope", "max_tokens": 5, "messages": MESSAGES}),
    ("/v1/messages/count_tokens", {"model": TINY_ID, "messages": 3}),
    ("/api/chat", {"model": "nope", "messages": MESSAGES}),
    ("/api/generate", {"model": TINY_ID, "prompt": "hi", "keep_alive": "soon"}),
    ("/api/embed", {"model": TINY_ID, "input": 5}),
    ("/api/embeddings", {"model": "nope", "prompt": "a"}),
]


def answers(daemon: LiveDaemon, raws: list[tuple[str, bytes]]) -> list[tuple[int, bytes]]:
    headers = {**daemon.auth_headers, "x-api-key": daemon.owner_token, "Content-Type": "application/json"}
    with httpx.Client(base_url=daemon.base, headers=headers, timeout=60) as c:
        return [(r.status_code, r.content) for r in (c.post(path, content=raw) for path, raw in raws)]


def test_every_api_answers_a_body_parsed_in_the_worker_byte_for_byte_as_in_process(
    daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    raws = [(path, raw) for path, doc in APIS for raw in (json.dumps(doc).encode(), b"{", b'{"model": 1e999}')]
    # One over the size limit: refused while it is read, before any parse.
    too_big = daemon.daemon.config.max_request_bytes + 1
    raws.append(("/v1/chat/completions", b'{"model":"m","messages":"' + b"x" * too_big + b'"}'))
    monkeypatch.setattr(routes, "PROCESS_BODY_BYTES", 2**62)  # all in process
    here = answers(daemon, raws)
    assert not daemon.daemon.bodies.started
    monkeypatch.setattr(routes, "PROCESS_BODY_BYTES", 0)  # all in the worker
    there = answers(daemon, raws)
    assert daemon.daemon.bodies.started
    assert {status for status, _ in here} >= {400, 404, 413}
    for (path, _), a, b in zip(raws, here, there, strict=True):
        assert a == b, path


FLAG_WAIT_MS = 20_000


class PollFD(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def held_parse(body: dict[str, str]) -> str:
    """Hold the interpreter lock, in one C call, until a byte arrives on the fifo `body["fifo"]` (or 20 s pass).

    `ctypes.PyDLL` keeps the lock during the call, as a decoder or validator written in C does."""
    fd = os.open(body["fifo"], os.O_RDONLY | os.O_NONBLOCK)
    Path(body["started"]).touch()  # only once the fifo has its reader: the test's write cannot find none
    try:
        poll = ctypes.PyDLL(None).poll
        poll(ctypes.byref(PollFD(fd, 1, 0)), 1, FLAG_WAIT_MS)  # POLLIN
        return os.read(fd, 1).decode() or "timed out"
    finally:
        os.close(fd)


def echo(body: dict[str, str]) -> dict[str, str]:
    return body


def slow_stream(daemon: LiveDaemon, on_delta: Callable[[], object], done: threading.Event) -> None:
    """A long greedy stream of the slow model, `on_delta` at each text delta, until `done` (leaving cancels it)."""
    ask = {"model": SLOW_ID, "input": "count", "stream": True, "temperature": 0, "max_output_tokens": 2000}
    with (
        httpx.Client(timeout=120, headers=daemon.auth_headers) as c,
        c.stream("POST", daemon.url + "/responses", json=ask) as r,
    ):
        for line in r.iter_lines():
            if done.is_set():
                return
            if line.startswith("event: response.output_text.delta"):
                on_delta()


def test_the_streams_tokens_flow_while_the_worker_parses(daemon: LiveDaemon, tmp_path: Path) -> None:
    """A parse that holds its interpreter lock until the stream has delivered a few more tokens: in the worker
    it ends when they have arrived; in the service's process it would hold the relay, and time out first."""
    fifo, started = tmp_path / "fifo", tmp_path / "started"
    os.mkfifo(fifo)
    # The worker starts, and imports this module, before the stream: in the idle scheduling class, beside a
    # model that keeps both cores busy, that start could outlast the stream.
    assert asyncio.run(daemon.daemon.bodies.parse(echo, b'{"a": "b"}')) == {"a": "b"}
    events: list[int] = []
    during: list[int] = []
    seen = threading.Condition()
    done = threading.Event()

    def delta() -> None:
        with seen:
            events.append(1)
            seen.notify_all()

    streaming = threading.Thread(target=slow_stream, args=(daemon, delta, done))
    streaming.start()
    try:
        with seen:
            assert seen.wait_for(lambda: len(events) >= 2, 60), "the stream did not start"
        parsed: list[str] = []
        raw = json.dumps({"fifo": str(fifo), "started": str(started)}).encode()
        parsing = threading.Thread(
            target=lambda: parsed.append(asyncio.run(daemon.daemon.bodies.parse(held_parse, raw)))
        )
        parsing.start()
        with seen:
            assert seen.wait_for(started.exists, 60)
            first = len(events)
            seen.wait_for(lambda: len(events) >= first + 5 or not parsing.is_alive(), 60)
            during.append(len(events) - first)
        assert parsing.is_alive(), f"the parse ended first ({parsed}), after {during[0]} more tokens"
        w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the worker reads it: the parse ends
        try:
            os.write(w, b"k")
        finally:
            os.close(w)
        parsing.join(60)
        assert parsed == ["k"], "the parse ended before the stream had delivered its tokens"
        assert during[0] >= 5
    finally:
        done.set()
        streaming.join(120)


def test_a_parsed_body_sends_each_long_text_back_once() -> None:
    """The decoded body and the items made from it hold the same texts: they travel (and stay) shared."""
    texts = [f"{i} " + "the keeper lights the lamp " * 12 for i in range(2 * CHUNK_ITEMS + 3)]
    doc = {"model": "m", "input": [{"role": "user", "content": text} for text in texts]}
    raw = json.dumps(doc).encode()
    sent = sliced_parse_body(parse_response_create, raw)
    back = sent.load()
    assert back == parse_body(parse_response_create, raw)
    for i in (0, CHUNK_ITEMS + 1, len(texts) - 1):  # items and body travel in slices: still one string each
        assert back.items[i].text is back.raw["input"][i]["content"]
    assert len(sent.data) < 1.5 * sum(map(len, texts))  # not twice
    assert sent.slices == 6  # the items and the body's input, three slices each


def where_parsed(body: dict[str, str]) -> tuple[int, int]:
    """The scheduling class and niceness of the thread that parses (in the worker)."""
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="the idle scheduling class is Linux's")
def test_the_worker_parses_in_the_idle_class_while_a_model_decodes_and_at_normal_priority_otherwise() -> None:
    """Beside a decode the parse steps aside; with nothing to step aside for it does not (the idle class
    would wait behind every other busy program), and a parse in the background does not leave it there."""
    bodies = BodyParser()
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        asked = [False, True, False, True]
        got = [asyncio.run(bodies.parse(where_parsed, b"{}", background=background)) for background in asked]
        assert got == [
            (os.SCHED_IDLE, BACKGROUND_NICE) if background else (os.SCHED_OTHER, ours) for background in asked
        ]
    finally:
        bodies.close()


def raises_in_the_background(body: dict[str, str]) -> None:
    raise LMSPError(body["why"])


def test_a_parse_in_the_background_gives_the_same_object_or_error() -> None:
    raw = json.dumps({"model": "m", "input": "hi"}).encode()
    assert sliced_parse_body(parse_response_create, raw, True).load() == parse_body(parse_response_create, raw)
    with pytest.raises(LMSPError, match="no"):
        sliced_parse_body(raises_in_the_background, b'{"why": "no"}', True)


def collector_state(body: dict[str, str]) -> bool:
    return gc.isenabled()


@pytest.mark.parametrize("background", [False, True])
def test_the_worker_parses_with_the_collector_off_and_gives_it_back_as_it_was(background: bool) -> None:
    """The cyclic collector does not walk a parse's live objects (a fifth of the worker's CPU for an 8 MiB
    body), and after the parse it is as before: on again, or still off, also when the parse failed."""
    assert gc.isenabled()
    assert sliced_parse_body(collector_state, b"{}", background).load() is False
    assert gc.isenabled()
    with pytest.raises(LMSPError, match="no"):
        sliced_parse_body(raises_in_the_background, b'{"why": "no"}', background)
    assert gc.isenabled()
    gc.disable()
    try:
        assert sliced_parse_body(collector_state, b"{}", background).load() is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_big_body_steps_aside_only_while_a_model_decodes(daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """The route asks the worker to step aside exactly when the service has a decode running."""
    bodies = daemon.daemon.bodies
    real = bodies.parse
    asked: list[bool] = []

    async def recording(parse: Any, raw: bytes, *, background: bool = False) -> Any:
        asked.append(background)
        return await real(parse, raw, background=background)

    monkeypatch.setattr(bodies, "parse", recording)
    big = {"model": TINY_ID, "input": "word " * 60_000, "max_output_tokens": 1}  # 300 KB: the worker's
    deltas = threading.Semaphore(0)
    done = threading.Event()

    with httpx.Client(timeout=120, headers=daemon.auth_headers) as c:
        assert not daemon.service.decoding()
        c.post(daemon.url + "/responses", json=big)  # refused or answered: parsed either way
        streaming = threading.Thread(target=slow_stream, args=(daemon, deltas.release, done))
        streaming.start()
        try:
            assert deltas.acquire(timeout=60) and deltas.acquire(timeout=60), "the stream did not start"
            assert daemon.service.decoding()
            c.post(daemon.url + "/responses", json=big)
        finally:
            done.set()
            streaming.join(120)
    assert asked == [False, True]


def test_a_large_request_comes_back_with_its_summaries_worked_out_in_the_worker() -> None:
    """What the service asks of a large request's items (`images`, `text_chars`) is worked out where the
    body is parsed and travels with the object, for each API's chat shape; a small request leaves it to
    the first who asks. The values are those a fresh copy works out."""
    text = "the keeper lights the lamp " * (LARGE_REQUEST_CHARS // 20)
    turns = [{"role": "user", "content": f"  {text} "}, {"role": "assistant", "content": "ok"}]
    shapes = [
        (parse_response_create, {"model": "m", "input": turns, "instructions": "sys"}, lambda r: r),
        (parse_chat_create, {"model": "m", "messages": turns}, lambda r: r.request),
        (parse_message_create, {"model": "m", "max_tokens": 5, "messages": turns}, lambda r: r.request),
        (parse_chat, {"model": "m", "messages": turns}, lambda r: r.request),
    ]
    for parse, doc, request_of in shapes:
        request = request_of(sliced_parse_body(parse, json.dumps(doc).encode()).load())
        assert {"images", "text_chars"} <= set(vars(request)), parse.__name__
        assert request.text_chars == dataclasses.replace(request).text_chars, parse.__name__
        assert request.text_chars["user"] == len(text.strip()) and request.images == [], parse.__name__
        small = request_of(parse({**doc, **({"input": "hi"} if "input" in doc else {"messages": turns[1:]})}))
        assert not {"images", "text_chars"} & set(vars(small)), parse.__name__


def test_long_lists_come_back_in_slices_from_every_parser() -> None:
    """Each parser's object, whatever holds its long lists (a dataclass, a tuple, a dict), comes back in
    slices that put it together equal; a long list of numbers travels whole (the memo keeps no numbers)."""
    n = CHUNK_ITEMS + 5
    turns = [{"role": "user", "content": f"m{i}"} for i in range(n)]
    shapes = [
        (parse_response_create, {"model": "m", "input": turns}),
        (parse_openai_response_create, {"model": "m", "input": turns}),
        (parse_chat_create, {"model": "m", "messages": turns}),
        (parse_message_create, {"model": "m", "max_tokens": 5, "messages": turns}),
        (parse_chat, {"model": "m", "messages": turns}),
        (parse_embedding_create, {"model": "m", "input": [f"t{i}" for i in range(n)]}),
        (parse_embed, {"model": "m", "input": [f"t{i}" for i in range(n)]}),
    ]
    for parse, doc in shapes:
        raw = json.dumps(doc).encode()
        sent = sliced_parse_body(parse, raw)
        assert sent.slices >= 2 and sent.load() == parse_body(parse, raw), parse.__name__
    numbers = json.dumps({"model": "m", "input": list(range(n))}).encode()
    sent = sliced_parse_body(parse_embedding_create, numbers)
    assert sent.slices == 0 and sent.load() == parse_body(parse_embedding_create, numbers)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes are Linux's")
def test_the_pipes_to_and_from_the_worker_hold_a_mebibyte() -> None:
    """Bodies and objects of megabytes cross them in a few reads rather than one per 64 KiB."""
    import fcntl

    bodies = BodyParser()
    try:
        assert outcome(parse_response_create, b'{"model": "m", "input": "hi"}', bodies) == outcome(
            parse_response_create, b'{"model": "m", "input": "hi"}', None
        )
        pool = bodies._pool
        for end in (pool._call_queue._writer, pool._result_queue._reader):
            assert fcntl.fcntl(end.fileno(), fcntl.F_GETPIPE_SZ) == PIPE_BYTES
    finally:
        bodies.close()
