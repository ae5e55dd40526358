"""Connections that cannot be held open for free, and requests framed only one way.

uvicorn's h11 protocol times only the pause between two requests on a kept-alive connection. A
client that connects and sends nothing, trickles a request head a byte at a time, or sends an
endless body keeps its socket (a file descriptor) forever; a few hundred of them once took the
service to its descriptor limit, where it stopped answering anything. `GuardedH11Protocol` adds:

- **a request-head deadline** (`head_timeout`): from the connection's first moment, or from the
  first byte of a later request on a kept-alive connection, the request line and headers must be
  complete within it, or the connection is closed;
- **a body deadline** (`body_timeout`): a request's body must have arrived within it (8 MiB, the
  body limit, in 60 s is a floor of about 140 kB/s — loopback clients send far faster);
- **an idle keep-alive timeout** (`idle_timeout`, uvicorn's own `timeout_keep_alive`);
- **a cap on open connections** (`max_connections`, kept below the descriptor limit, whose soft
  value `descriptor_budget` raises toward the hard one at start-up): at the cap, a new connection
  evicts the one that has waited longest for a request head; when every connection is busy with a
  request, the new one is answered 503 and closed.

Nothing times a response being written: a long SSE stream is never cut.

A refusal here (a malformed or over-long head, the cap, a body that never came), and an answer
the application sent before reading all of the request's body (a 413 or 401 to an upload whose client
asked for `Connection: close`), end with the connection **closing lingering**: the answer is sent
with a FIN, and what the client still sends is read and dropped until it closes too (or
`LINGER_IDLE` passes without a byte, or `LINGER_MAX` in all). Closing at once, with the rest of a
100 kB URL or of an upload unread, made the kernel reset the connection, and a reset can overtake
the answer: the client saw "connection reset" or "broken pipe" instead of its 414 (CI, twice) or 413. An over-long head is refused the same way whether it arrives at once (the
security layer) or in pieces (h11 stops buffering it here): 414 when the request line is what is
too long, else 400 for the headers, in the error shape of the API its path names.

Request smuggling (RFC 9112 §6.1): a request carrying both `Content-Length` and
`Transfer-Encoding` (in any order, however the value is spaced), or `Transfer-Encoding` in
HTTP/1.0, is refused with 400 and the connection is closed, so no byte after it runs as another
request. h11 already refuses other codings, repeated or conflicting lengths, and malformed heads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from lmsp_tray.errors import InvalidRequest, LMSPError, RequestTimeout, ServiceUnavailable, UriTooLong
from lmsp_tray.http.api import Api, ErrorShape, api_for
from lmsp_tray.http.problems import PROBLEMS
from lmsp_tray.http.security import MAX_HEADER_BYTES, MAX_HEADERS, MAX_URL_BYTES

try:
    import resource
except ImportError:  # Windows: no descriptor limit to raise (sockets are handles there)
    resource = None  # type: ignore[assignment]

log = logging.getLogger("lmsp_tray.http.connections")

DESCRIPTOR_RESERVE = 256  # descriptors kept for model files, the database, logs, child processes
FD_SOFT_TARGET = 65536  # how far the soft descriptor limit is raised (never past the hard one)
LINGER_IDLE = 2.0  # after a refusal, how long to wait for the client's next byte before closing anyway
LINGER_MAX = 10.0  # and how long to read and drop what it sends, in all
LINE_KEPT = 512  # how much of a request line is kept to name the API a refusal answers for


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout: float = 10.0
    body_timeout: float = 60.0
    idle_timeout: float = 15.0
    max_connections: int = 4096


def descriptor_budget(wanted: int) -> int:
    """The connection cap to use: `wanted`, or less where the descriptor limit is lower.

    Raises the soft RLIMIT_NOFILE toward the hard limit first (up to `FD_SOFT_TARGET`), then keeps
    `DESCRIPTOR_RESERVE` descriptors for everything that is not a connection."""
    if resource is None:
        return wanted
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = FD_SOFT_TARGET if hard == resource.RLIM_INFINITY else min(hard, FD_SOFT_TARGET)
        if soft != resource.RLIM_INFINITY and soft < target:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    except (ValueError, OSError):  # pragma: no cover - no limits to read
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(16, soft - DESCRIPTOR_RESERVE))


class _FramingChecked(h11.Connection):
    """h11, refusing a request framed two ways (smuggling), and telling its protocol when a
    request head has arrived and when the request's body has ended."""

    protocol: GuardedH11Protocol | None = None
    refused: str | None = None  # why the last request was refused (uvicorn's handler drops the exception)
    refused_status = 400  # h11's hint: 431 when the head grew past the limit unfinished

    def next_event(self) -> Any:
        try:
            return self._checked(super().next_event())
        except h11.RemoteProtocolError as exc:
            self.refused, self.refused_status = str(exc), exc.error_status_hint
            raise

    def _checked(self, event: Any) -> Any:
        if isinstance(event, h11.Request):
            names = [name for name, _ in event.headers]
            chunked = b"transfer-encoding" in names
            if chunked and (b"content-length" in names or event.http_version == b"1.0"):
                raise h11.RemoteProtocolError(
                    "A request with both Content-Length and Transfer-Encoding (or Transfer-Encoding in HTTP/1.0) "
                    "is refused (RFC 9112 section 6.1); the connection is closed."
                )
            if self.protocol is not None:
                self.protocol.request_started(has_body=chunked or _declared_length(event.headers) > 0)
        elif isinstance(event, h11.EndOfMessage) and self.protocol is not None:
            self.protocol.body_ended()
        return event


def _declared_length(headers: Any) -> int:
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return 0


class _ClosesLingering(asyncio.Transport):
    """The connection's transport as uvicorn sees it, closing lingering where an answer was sent before
    the request's body arrived (`GuardedH11Protocol.owes_linger`); everything else is the socket's."""

    def __init__(self, inner: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        super().__init__()
        self.inner = inner
        self.protocol = protocol

    def close(self) -> None:
        if self.protocol.owes_linger():
            self.protocol.close_lingering()
        elif not self.protocol.lingering:
            self.inner.close()

    def is_closing(self) -> bool:
        return self.inner.is_closing() or self.protocol.lingering

    def write(self, data: Any) -> None:
        self.inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.inner.writelines(list_of_data)

    def write_eof(self) -> None:
        self.inner.write_eof()

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()

    def abort(self) -> None:
        self.inner.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines, a connection cap and a framing check (see the module)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    apis: ClassVar[Sequence[Api]] = ()  # whose error shape a refusal takes, by the path it names

    def __init__(self, config: Any, server_state: Any, app_state: Any, _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        size = config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self.conn = _FramingChecked(h11.SERVER, size)
        self.conn.protocol = self
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0
        self._line = bytearray()  # the start of the request line still arriving (see `_shape`)
        self._line_ended = False  # whether that line has ended (see `_head_too_large`)
        self.lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_ends = 0.0

    # -- the connection cap ------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        others = [c for c in self.connections if c is not self and not _socket_of(c).is_closing()]
        super().connection_made(transport)
        self.socket_transport: asyncio.Transport = transport
        self.transport = _ClosesLingering(transport, self)
        self._waiting_since = self.loop.time()
        self._arm_head()
        if len(others) < self.limits.max_connections:
            return
        waiting = [c for c in others if isinstance(c, GuardedH11Protocol) and (c.waiting_for_head() or c.lingering)]
        if waiting:
            victim = min(waiting, key=lambda c: c._waiting_since)
            log.warning("%d connections open (the cap): closing one idle longest", len(others))
            victim.socket_transport.close()
            return
        log.warning("%d connections open (the cap), all busy: refusing a new one", len(others))
        self._refuse(ServiceUnavailable("Too many open connections; try again shortly.", headers={"Retry-After": "1"}))

    def waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE

    # -- deadlines -----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._linger()  # read and dropped; the client has not closed yet
            return
        if self._head_timer is None and self.waiting_for_head():
            self._waiting_since = self.loop.time()
            self._forget_line()
            self._arm_head()  # a later request on a kept-alive connection: its head is timed from its first byte
        if self._head_timer is not None and not self._line_ended:
            self._line += data[: LINE_KEPT - len(self._line)]
            self._line_ended = b"\n" in data
        super().data_received(data)

    def request_started(self, *, has_body: bool) -> None:
        _cancel(self._head_timer)
        self._head_timer = None
        self._forget_line()
        if has_body:
            _cancel(self._body_timer)
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_expired)

    def body_ended(self) -> None:
        _cancel(self._body_timer)
        self._body_timer = None

    def on_response_complete(self) -> None:
        self._waiting_since = self.loop.time()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        _cancel(self._head_timer)
        _cancel(self._body_timer)
        _cancel(self._linger_timer)
        self._head_timer = self._body_timer = self._linger_timer = None
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self.lingering:  # the server is stopping: nothing more is owed here
            self.socket_transport.close()
            return
        super().shutdown()

    def _forget_line(self) -> None:
        self._line.clear()
        self._line_ended = False

    def _arm_head(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_expired)

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.waiting_for_head() and not self.transport.is_closing():
            self.transport.close()  # idle or trickling: no answer is owed for a request never made

    def _body_expired(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.socket_transport.is_closing():
            return
        log.info("a request body did not arrive within %g s: closing its connection", self.limits.body_timeout)
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(
                RequestTimeout(f"The request body did not arrive within {self.limits.body_timeout:g} seconds.")
            )
        else:
            self.socket_transport.close()  # no lingering: the body is what never came

    # -- refusals ------------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """A request h11 (or the framing check) refused: an error in the API's shape, then the connection closes."""
        conn = self.conn
        if isinstance(conn, _FramingChecked) and conn.refused_status == 431:
            error = self._head_too_large()
        else:
            detail = conn.refused if isinstance(conn, _FramingChecked) and conn.refused else msg
            error = InvalidRequest(f"The request is not valid HTTP/1.1: {detail}")
        self._refuse(error)

    def _head_too_large(self) -> LMSPError:
        """What the security layer answers for the same head arriving at once: 414 for the URL, else 400."""
        if not self._line_ended:
            return UriTooLong(f"The request URL is over {MAX_URL_BYTES:,} bytes; the limit is {MAX_URL_BYTES:,} bytes.")
        return InvalidRequest(
            f"The request headers are over {MAX_HEADER_BYTES} bytes; the limits are {MAX_HEADER_BYTES} bytes and "
            f"{MAX_HEADERS} headers."
        )

    def _shape(self) -> ErrorShape:
        """The error shape of the API the refused request's path names (LMSP's where none can be read)."""
        line = bytes(self._line.split(b"\n", 1)[0]).split(b" ")
        if not self.apis or len(line) < 2:
            return PROBLEMS
        return api_for(self.apis, line[1].split(b"?", 1)[0].decode("latin-1")).errors

    def _refuse(self, error: LMSPError) -> None:
        status, headers, body = self._shape().encode(error)
        head = [
            f"HTTP/1.1 {status} {error.title}",
            *(f"{k.decode('latin-1')}: {v.decode('latin-1')}" for k, v in headers),
            "Connection: close",
            "LMSP-Version: 1.0",
        ]
        if self.cycle is not None:
            self.cycle.disconnected = True  # the application, if it runs, must not answer too
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.close_lingering()

    # -- closing without a reset ---------------------------------------------------------------------
    def owes_linger(self) -> bool:
        """Whether closing now would drop a request body still arriving after its complete answer."""
        cycle = self.cycle
        return (
            not self.lingering
            and not self.socket_transport.is_closing()
            and cycle is not None
            and cycle.response_complete
            and self.conn.their_state is h11.SEND_BODY
        )

    def close_lingering(self) -> None:
        """Send the answer with a FIN, then read and drop what the client still sends (see the module)."""
        _cancel(self._head_timer)
        _cancel(self._body_timer)
        self._head_timer = self._body_timer = None
        socket = self.socket_transport
        if self.lingering or socket.is_closing():
            return
        if not socket.can_write_eof():  # pragma: no cover - TLS or a transport without half-close
            socket.close()
            return
        self.lingering = True
        socket.write_eof()
        self._linger_ends = self.loop.time() + LINGER_MAX
        socket.resume_reading()  # uvicorn may have paused it for a pipelined request or a big body
        self._linger()

    def _linger(self) -> None:
        _cancel(self._linger_timer)
        wait = min(LINGER_IDLE, max(0.0, self._linger_ends - self.loop.time()))
        self._linger_timer = self.loop.call_later(wait, self.socket_transport.close)


def _socket_of(connection: Any) -> asyncio.Transport:
    """A connection's own socket transport (a lingering one counts against the cap until it closes)."""
    return getattr(connection, "socket_transport", connection.transport)


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def guarded_protocol(limits: ConnectionLimits, apis: Sequence[Api] = ()) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds each connection with, carrying these limits and the APIs whose
    error shapes its refusals take."""
    return type("GuardedH11", (GuardedH11Protocol,), {"limits": limits, "apis": tuple(apis)})
