"""Server-sent events: encoding, keep-alive comments, and stopping work when the client leaves.

`EventStream` is a small ASGI response. It sends each event the moment it
is produced (no buffering), writes a `: keep-alive` comment line after 15 s
of silence (configurable: `sse_keepalive` in config.toml), and watches the
connection: when the client disconnects it calls
`on_disconnect` at once (so generation stops within one decode step) and
closes the event source. Events must end with a terminal one; if the
source fails anyway, the stream still ends with an `error` event rather
than a broken connection.

The keep-alive is one comment line with no blank line after it. A blank line
ends an event, and clients that keep the last event id across events (as
the SSE spec says, and as the OpenAI Python SDK does) dispatch an *empty*
event when a blank line follows a comment after an event that had an `id:`
— the SDK then fails parsing its empty data as JSON. A lone comment line is
skipped by every parser and still keeps proxies and idle timers awake.

This is the one SSE framer (`frame`): every event's `data:` line is JSON from
`wire_json`, so no client's line splitter can cut it. Which lines an event
gets is the caller's (`encode`, `trailer`): LMSP's `id:` / `event:` / `data:`
by default (`encode_event`), `event:` and `data:` for OpenAI's Responses
(`encode_without_id`: a `/v1` stream cannot be resumed), bare `data:` lines
and a closing `DONE` for OpenAI's chat and text completions; Anthropic's
keep-alive is a `ping` event (`ping`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from lmsp_tray.errors import InternalError
from lmsp_tray.http import wire_json
from lmsp_tray.protocol.events import Event, error_event

log = logging.getLogger("lmsp_tray.http")

KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keep-alive\n"  # no blank line after it: see the module docstring
DONE = b"data: [DONE]\n\n"  # OpenAI's end of a completions stream (a `trailer`)


def frame(data: Any, *, event: str | None = None, event_id: int | None = None) -> bytes:
    """One event on the wire: an `id:` line and an `event:` line when given, then `data:` (`wire_json`)."""
    head = (f"id: {event_id}\n" if event_id is not None else "") + (f"event: {event}\n" if event else "")
    return f"{head}data: {wire_json.dumps(data)}\n\n".encode()


def encode_event(event: Event) -> bytes:
    """LMSP's framing: `id:`, `event:`, `data:` (a client resumes after the last id it saw)."""
    return frame(event.data, event=event.name, event_id=event.id)


def encode_without_id(event: Event) -> bytes:
    """OpenAI's Responses framing: `event:` and `data:`, no `id:` (such a stream cannot be resumed)."""
    return frame(event.data, event=event.name)


class EventStream:
    def __init__(
        self,
        events: AsyncIterator[Event],
        *,
        on_disconnect: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
        keepalive: float | None = KEEPALIVE_SECONDS,
        encode: Callable[[Event], bytes] = encode_event,
        trailer: bytes = b"",
        ping: bytes = KEEPALIVE,
        media_type: str = "text/event-stream; charset=utf-8",
    ) -> None:
        self._encode = encode  # how an event is written (`/v1` writes OpenAI's, without `id:` lines)
        self._events = events
        self._on_disconnect = on_disconnect
        self._headers = headers or {}
        self._keepalive = keepalive
        self._trailer = trailer  # written after the last event of a stream that ended normally
        self._ping = ping  # the keep-alive (Anthropic's clients read a `ping` event)
        self._media_type = media_type  # Ollama's NDJSON streams (`keepalive` None: no line fits them) too

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", self._media_type.encode("latin-1")),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self._headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        source = self._events.__aiter__()
        last_id = 0
        pending: asyncio.Future | None = None
        try:
            while True:
                pending = asyncio.ensure_future(source.__anext__())
                while True:
                    done, _ = await asyncio.wait(
                        {pending, gone}, timeout=self._keepalive, return_when=asyncio.FIRST_COMPLETED
                    )
                    if gone in done:
                        raise _ClientGone
                    if pending in done:
                        break
                    await send({"type": "http.response.body", "body": self._ping, "more_body": True})
                try:
                    event = pending.result()
                except StopAsyncIteration:
                    break
                finally:
                    pending = None
                last_id = event.id
                await send({"type": "http.response.body", "body": self._encode(event), "more_body": True})
                if event.terminal:
                    break
            if self._trailer:
                await send({"type": "http.response.body", "body": self._trailer, "more_body": True})
        except _ClientGone:
            if self._on_disconnect is not None:
                self._on_disconnect()
            return
        except OSError:  # the socket went away mid-send
            if self._on_disconnect is not None:
                self._on_disconnect()
            return
        except Exception:
            log.exception("event stream failed")
            problem = InternalError("The stream failed unexpectedly; it has been logged.").to_problem()
            with contextlib.suppress(Exception):
                await send(
                    {
                        "type": "http.response.body",
                        "body": self._encode(error_event(last_id + 1, problem)),
                        "more_body": True,
                    }
                )
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            gone.cancel()
            with contextlib.suppress(BaseException):
                await gone
            with contextlib.suppress(Exception):
                await source.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class _ClientGone(Exception):
    pass


async def _wait_disconnect(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def wait_disconnect(receive: Any) -> None:
    """Resolves when the client disconnects (the request body must already have been read)."""
    await _wait_disconnect(receive)


T = TypeVar("T")


async def unless_client_leaves(receive: Any, work: Awaitable[T], on_leave: Callable[[], None]) -> T:
    """Await `work` (a non-streamed answer); if the client disconnects first, call `on_leave` (stop
    the work now) and still await `work`, which then ends as its stop says."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            on_leave()
        return await task
    finally:
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone
