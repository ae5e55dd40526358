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

Request smuggling (RFC 9112 §6.1): a request carrying both `Content-Length` and
`Transfer-Encoding` (in any order, however the value is spaced), or `Transfer-Encoding` in
HTTP/1.0, is refused with 400 and the connection is closed, so no byte after it runs as another
request. h11 already refuses other codings, repeated or conflicting lengths, and malformed heads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from lmsp_tray.errors import InvalidRequest, LMSPError, RequestTimeout, ServiceUnavailable
from lmsp_tray.http import wire_json

try:
    import resource
except ImportError:  # Windows: no descriptor limit to raise (sockets are handles there)
    resource = None  # type: ignore[assignment]

log = logging.getLogger("lmsp_tray.http.connections")

DESCRIPTOR_RESERVE = 256  # descriptors kept for model files, the database, logs, child processes
FD_SOFT_TARGET = 65536  # how far the soft descriptor limit is raised (never past the hard one)


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

    def next_event(self) -> Any:
        try:
            return self._checked(super().next_event())
        except h11.RemoteProtocolError as exc:
            self.refused = str(exc)
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


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines, a connection cap and a framing check (see the module)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, config: Any, server_state: Any, app_state: Any, _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        size = config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self.conn = _FramingChecked(h11.SERVER, size)
        self.conn.protocol = self
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0

    # -- the connection cap ------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        others = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._arm_head()
        if len(others) < self.limits.max_connections:
            return
        waiting = [c for c in others if isinstance(c, GuardedH11Protocol) and c.waiting_for_head()]
        if waiting:
            victim = min(waiting, key=lambda c: c._waiting_since)
            log.warning("%d connections open (the cap): closing one idle longest", len(others))
            victim.transport.close()
            return
        log.warning("%d connections open (the cap), all busy: refusing a new one", len(others))
        self._refuse(ServiceUnavailable("Too many open connections; try again shortly.", headers={"Retry-After": "1"}))

    def waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE

    # -- deadlines -----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.waiting_for_head():
            self._waiting_since = self.loop.time()
            self._arm_head()  # a later request on a kept-alive connection: its head is timed from its first byte
        super().data_received(data)

    def request_started(self, *, has_body: bool) -> None:
        _cancel(self._head_timer)
        self._head_timer = None
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
        self._head_timer = self._body_timer = None
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_expired)

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.waiting_for_head() and not self.transport.is_closing():
            self.transport.close()  # idle or trickling: no answer is owed for a request never made

    def _body_expired(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        log.info("a request body did not arrive within %g s: closing its connection", self.limits.body_timeout)
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(
                RequestTimeout(f"The request body did not arrive within {self.limits.body_timeout:g} seconds.")
            )
        else:
            self.transport.close()

    # -- refusals ------------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """A request h11 (or the framing check) refused: a problem document, then the connection closes."""
        detail = self.conn.refused if isinstance(self.conn, _FramingChecked) and self.conn.refused else msg
        self._refuse(InvalidRequest(f"The request is not valid HTTP/1.1: {detail}"))

    def _refuse(self, error: LMSPError) -> None:
        body = wire_json.dumpb(error.to_problem())
        head = [
            f"HTTP/1.1 {error.status} {error.title}",
            "Content-Type: application/problem+json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            "LMSP-Version: 1.0",
            *(f"{k}: {v}" for k, v in error.headers.items()),
        ]
        if self.cycle is not None:
            self.cycle.disconnected = True  # the application, if it runs, must not answer too
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.transport.close()


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds each connection with, carrying these limits."""
    return type("GuardedH11", (GuardedH11Protocol,), {"limits": limits})
