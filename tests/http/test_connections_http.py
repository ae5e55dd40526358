"""Slow and idle clients, the connection cap and request smuggling, over raw sockets against the
real service (issue 15 items 5 and 6)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from support import SLOW_ID, LiveDaemon, wait_until

HEAD = "Host: 127.0.0.1\r\n"


def connect(live: LiveDaemon, timeout: float = 15) -> socket.socket:
    return socket.create_connection(("127.0.0.1", live.daemon.port or 0), timeout=timeout)


def read_all(s: socket.socket, *, reset_ok: bool = False) -> bytes:
    """Everything the server sends until it closes the connection (the test fails if it never does,
    or resets it where an answer is owed: a refusal closes lingering, so no reset overtakes it)."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            if not reset_ok:
                raise
            break
        if not chunk:
            return data
        data += chunk
    return data


def exchange(live: LiveDaemon, raw: bytes) -> bytes:
    with connect(live) as s:
        s.sendall(raw)
        return read_all(s)


def statuses(data: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] ([0-9]{3}) ", data)]


SMUGGLED = b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def framed(*headers: str, body: bytes = b"0\r\n\r\n" + SMUGGLED, version: str = "1.1") -> bytes:
    lines = "".join(h + "\r\n" for h in headers)
    return (
        f"POST /lmsp/v1/auth/pairings HTTP/{version}\r\n{HEAD}Content-Type: application/json\r\n{lines}\r\n".encode()
        + body
    )


SMUGGLING = [
    ("Content-Length: 52", "Transfer-Encoding: chunked"),
    ("Transfer-Encoding: chunked", "Content-Length: 52"),
    ("Content-Length: 52", "Transfer-Encoding:\tchunked"),
    ("Content-Length: 52", "Transfer-Encoding: \tchunked \t"),
    ("Content-Length: 52", "transfer-encoding: CHUNKED"),
    ("Content-Length: 0", "Transfer-Encoding: chunked"),
    ("Transfer-Encoding: chunked", "Content-Length: 52", "Content-Length: 52"),
]


@pytest.mark.parametrize("headers", SMUGGLING)
def test_both_framings_are_refused_and_the_connection_closed(daemon: LiveDaemon, headers: tuple[str, ...]) -> None:
    data = exchange(daemon, framed(*headers))
    assert statuses(data) == [400], data[:400]  # one answer: nothing after it ran
    assert b"connection: close" in data.lower() and b"RFC 9112" in data


def test_neighbours_of_smuggling(daemon: LiveDaemon) -> None:
    # Transfer-Encoding in HTTP/1.0, other codings, two lengths: refused, closed.
    for raw in (
        framed("Transfer-Encoding: chunked", version="1.0"),
        framed("Transfer-Encoding: gzip, chunked"),
        framed("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"),
        framed("Content-Length: 52", "Content-Length: 53"),
        framed("Content-Length: -1"),
    ):
        assert statuses(exchange(daemon, raw)) == [400], raw[:120]
    # One framing each: the request is answered and the pipelined one after it runs as it should.
    pairing = b'{"app_name":"x","scopes":["models:read"]}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(pairing), pairing)
    for raw in (
        framed(f"Content-Length: {len(pairing)}", body=pairing + SMUGGLED),
        framed("Transfer-Encoding: chunked", body=chunked + SMUGGLED),
    ):
        with connect(daemon) as s:
            s.sendall(raw + b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert statuses(read_all(s)) == [202, 200, 200]


def test_idle_and_trickling_clients_are_closed(daemon_factory: Callable[..., LiveDaemon]) -> None:
    live = daemon_factory(request_head_timeout=1.0, request_body_timeout=2.0, idle_timeout=1.0)
    with connect(live) as idle:  # never sends a byte: closed (a service that kept it would time the read out)
        assert read_all(idle) == b""

    with connect(live) as trickle:  # a request head, one byte at a time, never finished
        for byte in b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200:
            try:
                trickle.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
        assert read_all(trickle, reset_ok=True) == b""  # closed, without an answer (none owed, so no lingering)

    with connect(live) as body:  # a complete head, then a body that never ends
        body.sendall(f"POST /lmsp/v1/auth/pairings HTTP/1.1\r\n{HEAD}Content-Length: 100000\r\n\r\n{{".encode())
        answer = read_all(body)
        assert statuses(answer) == [408] and b"request_timeout" in answer

    with connect(live) as chunks:  # chunked, a chunk every half second: still too late
        chunks.sendall(f"POST /lmsp/v1/auth/pairings HTTP/1.1\r\n{HEAD}Transfer-Encoding: chunked\r\n\r\n".encode())
        for _ in range(8):
            try:
                chunks.sendall(b"1\r\n \r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.5)
        assert statuses(read_all(chunks)) == [408]

    # The neighbour: a body that trickles but ends within the deadline is served.
    with connect(live) as steady:
        pairing = b'{"app_name":"steady","scopes":["models:read"]}'
        steady.sendall(f"POST /lmsp/v1/auth/pairings HTTP/1.1\r\n{HEAD}Content-Length: {len(pairing)}\r\n\r\n".encode())
        for i in range(0, len(pairing), 12):
            steady.sendall(pairing[i : i + 12])
            time.sleep(0.3)  # 1.2 s in all, under the 2 s deadline (and each pause under the head's)
        steady.shutdown(socket.SHUT_WR)
        assert statuses(read_all(steady)) == [202]

    # A kept-alive connection: reused within the idle timeout, closed after it.
    with connect(live) as kept:
        kept.sendall(b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        wait_until(lambda: b"\r\n\r\n" in kept.recv(65536, socket.MSG_PEEK), 10, "the first answer")
        kept.recv(65536)
        time.sleep(0.3)
        kept.sendall(b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.3)
        first = kept.recv(65536)
        assert statuses(first) == [200]
        assert read_all(kept) == b""  # then idle: closed


def test_a_long_stream_is_not_cut_by_the_deadlines(daemon_factory: Callable[..., LiveDaemon]) -> None:
    """Deadlines of half a second, a stream of 4000 tokens whose reader pauses for 2 s after the first:
    no timer touches a response while it is written."""
    live = daemon_factory(request_head_timeout=0.5, request_body_timeout=0.5, idle_timeout=0.5)
    body = {"model": SLOW_ID, "input": "x", "max_output_tokens": 4000, "stream": True, "temperature": 0}
    with (
        httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=120) as c,
        c.stream("POST", "/responses", json=body) as r,
    ):
        lines = r.iter_lines()
        next(line for line in lines if line == "event: response.output_text.delta")
        time.sleep(2.0)  # four times every deadline, with the response still being generated
        rest = list(lines)
    terminal = [line for line in rest if line.startswith("event: response.")][-1]
    assert terminal in ("event: response.completed", "event: response.incomplete"), terminal
    assert sum(1 for line in rest if line == "event: response.output_text.delta") > 100


def send_in_pieces(s: socket.socket, data: bytes, size: int = 4096) -> None:
    for i in range(0, len(data), size):
        s.sendall(data[i : i + size])
        time.sleep(0.002)


LONG = "x" * 100_000
OVER_LONG = [  # a head past h11's buffer, what it is answered, and a sign of its API's error shape
    (f"GET /lmsp/v1/models/{LONG} HTTP/1.1\r\n{HEAD}\r\n", 414, b"application/problem+json"),
    (f"GET /v1/models/{LONG} HTTP/1.1\r\n{HEAD}\r\n", 414, b'"type":"invalid_request_error"'),
    (f"POST /v1/messages?q={LONG} HTTP/1.1\r\n{HEAD}\r\n", 414, b'{"type":"error","error":'),
    (
        "GET /lmsp/v1/ HTTP/1.1\r\n" + HEAD + "".join(f"X-H{i}: {'v' * 60}\r\n" for i in range(1500)) + "\r\n",
        400,
        b"problem",
    ),
]


@pytest.mark.parametrize(
    ("raw", "status", "shape"), OVER_LONG, ids=["lmsp-url", "openai-url", "anthropic-url", "headers"]
)
def test_an_over_long_head_gets_one_answer_however_it_arrives_and_no_reset(
    daemon: LiveDaemon, raw: str, status: int, shape: bytes
) -> None:
    """At once, the security layer refuses an over-long head; in pieces, h11 stops buffering it first.
    Either way: the same status, in the error shape of the API its path names, and the rest of what
    the client sends read and dropped, so no reset overtakes the answer (CI twice saw "connection
    reset" in place of a 414)."""
    data = raw.encode()
    for send in (socket.socket.sendall, send_in_pieces):
        with connect(daemon) as s:
            send(s, data)  # in pieces, most of it arrives after the refusal: a reset would fail here
            s.shutdown(socket.SHUT_WR)
            answer = read_all(s)
        assert statuses(answer) == [status], (send, answer[:400])
        assert shape in answer and LONG[:100].encode() not in answer and len(answer) < 2000, answer[:400]
    with connect(daemon) as s:  # a client that neither closes nor sends more: closed after the linger
        send_in_pieces(s, data[:80_000])
        started = time.monotonic()
        assert statuses(read_all(s)) == [status]
        assert time.monotonic() - started < 12


@pytest.mark.parametrize("close", ["Connection: close\r\n", "", "HTTP/1.0"], ids=["close", "keep-alive", "http-1.0"])
def test_an_upload_answered_before_it_is_read_is_not_reset(
    daemon_factory: Callable[..., LiveDaemon], close: str
) -> None:
    """A 413 (declared too big) or a 401 (no token) is sent before the body is read; where the
    connection then closes (the client asked for it, or spoke HTTP/1.0), it closes lingering: the client
    sends its 2 MB to the end and reads the answer, instead of a broken pipe or a reset."""
    live = daemon_factory(max_request_bytes=4096)
    body = b"{" + b" " * 2_000_000 + b"}"
    version, extra = ("1.0", "") if close == "HTTP/1.0" else ("1.1", close)
    for auth, status in ((f"Authorization: Bearer {live.owner_token}\r\n", 413), ("", 401)):
        head = (
            f"POST /lmsp/v1/responses HTTP/{version}\r\n{HEAD}{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        )
        with connect(live) as s:
            s.sendall(head.encode())
            send_in_pieces(s, body, 65536)
            s.shutdown(socket.SHUT_WR)
            assert statuses(read_all(s)) == [status]


def test_the_api_answers_with_1000_slow_connections_open(daemon: LiveDaemon) -> None:
    held: list[socket.socket] = []
    try:
        for i in range(1000):
            s = connect(daemon)
            if i % 3 == 0:
                s.sendall(b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127")  # a head begun, never finished
            elif i % 3 == 1:
                s.sendall(b"POST /lmsp/v1/auth/pairings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9999\r\n\r\n{")
            held.append(s)
        for _ in range(5):
            r = httpx.get(daemon.url + "/", timeout=5)
            assert r.status_code == 200
        r = httpx.post(daemon.url + "/auth/pairings", json={"app_name": "real", "scopes": ["models:read"]}, timeout=5)
        assert r.status_code == 202
    finally:
        for s in held:
            s.close()


def test_the_connection_cap_evicts_the_longest_idle(daemon_factory: Callable[..., LiveDaemon]) -> None:
    live = daemon_factory(max_connections=40, request_head_timeout=60.0)
    server = live.daemon._server
    assert server is not None
    held = [connect(live) for _ in range(120)]
    try:
        wait_until(lambda: len(server.server_state.connections) <= 41, 10, "the cap to hold")
        r = httpx.get(live.url + "/", timeout=5)  # a new client gets in: the longest idle made room
        assert r.status_code == 200
        assert len(server.server_state.connections) <= 41
        assert read_all(held[0]) == b""  # the oldest were closed
    finally:
        for s in held:
            s.close()


def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(daemon_factory: Callable[..., LiveDaemon]) -> None:
    live = daemon_factory(max_connections=2)
    body = {"model": SLOW_ID, "input": "x", "max_output_tokens": 400, "stream": True}
    gate = threading.Event()
    streams: list[threading.Thread] = []

    def stream() -> None:
        with (
            httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=120) as c,
            c.stream("POST", "/responses", json=body) as r,
        ):
            for _ in r.iter_bytes():
                gate.wait(60)
                break

    for _ in range(2):
        t = threading.Thread(target=stream)
        t.start()
        streams.append(t)
    server = live.daemon._server
    assert server is not None
    wait_until(lambda: len(server.server_state.tasks) >= 2, 60, "two busy streams")
    try:
        answer = exchange(live, b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert statuses(answer) == [503] and b"retry-after: 1" in answer.lower()
    finally:
        gate.set()
        for t in streams:
            t.join(60)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX descriptor limits")
def test_the_descriptor_limit_is_raised_and_the_cap_kept_below_it() -> None:
    code = (
        "import resource; from lmsp_tray.http.connections import descriptor_budget as b; "
        "print(b(4096), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    hard = subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
    raised = subprocess.run(
        ["sh", "-c", f'ulimit -Sn 512 && exec "{sys.executable}" -c "{code}"'], capture_output=True, text=True
    )
    cap, soft = map(int, raised.stdout.split())
    if hard != "unlimited":
        assert soft == min(int(hard), 65536)
    assert cap == min(4096, soft - 256)
    low = subprocess.run(
        ["sh", "-c", f'ulimit -n 1024 && exec "{sys.executable}" -c "{code}"'], capture_output=True, text=True
    )
    assert low.stdout.split() == ["768", "1024"], low.stderr
