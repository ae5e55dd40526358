"""The one SSE reader: events as the HTML standard parses them, however the bytes arrive."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from local_http import LocalHTTP

from lmsp_tray.client.sse import Event, lines, read_events, stream_events

STREAM = (
    b": keep-alive\r\n"
    b'id: 1\r\nevent: task.created\r\ndata: {"a": 1}\r\n\r\n'
    b"event: task.progress\ndata: first\ndata:second\ndata:  two spaces\n\n"
    b'id: 3\revent: task.completed\rdata: {"text": "line\xe2\x80\xa8sep\xe2\x80\xa9para\xc2\x85next"}\r\r'
    b"event: no-data\n\n"
    b"data: cut off at the end\n"
)
EXPECTED = [
    Event("task.created", '{"a": 1}', "1"),
    Event("task.progress", "first\nsecond\n two spaces", "1"),  # the last id stays; one space is dropped
    Event("task.completed", '{"text": "line\u2028sep\u2029para\u0085next"}', "3"),
]


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(STREAM)])
def test_events_whatever_the_chunks(size: int) -> None:
    assert list(read_events(chunked(STREAM, size))) == EXPECTED


def test_unicode_line_separators_do_not_cut_an_event() -> None:
    [event] = [e for e in read_events([STREAM]) if e.event == "task.completed"]
    assert event.json() == {"text": "line\u2028sep\u2029para\u0085next"}


def test_line_ends_and_a_byte_order_mark() -> None:
    assert list(lines([b"\xef\xbb\xbfa\r", b"\nb\rc\n\r"])) == [b"a", b"b", b"c", b""]
    assert list(read_events([b"\xef\xbb\xbfdata: x\n\n"])) == [Event("message", "x")]


def test_a_stream_over_http_with_the_token() -> None:
    body = b"".join(f"id: {n}\nevent: tick\ndata: {json.dumps({'n': n})}\n\n".encode() for n in (1, 2))
    server = LocalHTTP({"/lmsp/v1/tasks/t/events": (200, {"Content-Type": "text/event-stream"}, body)})
    try:
        got = list(stream_events(server.url + "/lmsp/v1/tasks/t/events?after=0", token="tok_secret", timeout=5))
    finally:
        server.close()
    assert [(e.id, e.event, e.json()) for e in got] == [("1", "tick", {"n": 1}), ("2", "tick", {"n": 2})]
    [seen] = server.seen
    assert seen.path.endswith("?after=0") and seen.headers["accept"] == "text/event-stream"
    assert seen.headers["authorization"] == "Bearer tok_secret"
