"""Reading a server-sent event stream: the one SSE reader outside the service.

Why: the CLI follows a download task's events (`/tasks/{id}/events`), and whatever else follows
a stream from outside the service should read it the same, correct way. Parsed as the HTML
standard says: lines end at CRLF, LF or CR (split on bytes, so U+2028 or U+0085 inside the data
never cut an event); ``data`` lines join with a newline; one space after the colon is dropped;
comment lines (keep-alives) are skipped; ``id`` sets the last event id, which stays for the
events after it; a blank line ends an event, and one without data is not dispatched. An event
the stream ends in the middle of is dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lmsp_tray.client.loopback import open_stream

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Event:
    """One dispatched event: its type (``message`` unless named), data and the last event id."""

    event: str
    data: str
    id: str = ""

    def json(self) -> Any:
        """The data decoded as JSON (raises ValueError when it is not)."""
        return json.loads(self.data)


def lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The stream's lines without their ends, however the bytes were cut into chunks."""
    pending = b""
    first = True
    for chunk in chunks:
        if not chunk:
            continue
        buffer = pending + chunk
        if first:
            buffer, first = buffer.removeprefix(_BOM), False
        held = buffer.endswith(b"\r")  # perhaps the first half of a CRLF: wait for the next byte
        *complete, pending = _EOL.split(buffer[:-1] if held else buffer)
        if held:
            pending += b"\r"
        yield from complete
    if pending.endswith(b"\r"):
        yield pending[:-1]


def read_events(chunks: Iterable[bytes]) -> Iterator[Event]:
    """The events of a stream given as bytes (an HTTP response, a list of chunks), as they come."""
    name, last_id = "", ""
    data: list[str] = []
    for raw in lines(chunks):
        if not raw:
            if data:
                yield Event(name or "message", "\n".join(data), last_id)
            name, data = "", []
            continue
        if raw.startswith(b":"):
            continue  # a comment: the keep-alive
        field, _, value = raw.partition(b":")
        text = value.removeprefix(b" ").decode("utf-8", errors="replace")
        if field == b"data":
            data.append(text)
        elif field == b"event":
            name = text
        elif field == b"id" and "\0" not in text:
            last_id = text


def stream_events(
    url: str, *, token: str | None = None, headers: Mapping[str, str] | None = None, timeout: float = 120.0
) -> Iterator[Event]:
    """The events of the loopback `url`'s stream, as they come; closed when the iteration ends.

    `timeout` bounds the wait for each read (the service sends keep-alives far more often).
    Raises `OSError` (an error status is `urllib.error.HTTPError`) and `NotLoopback`."""
    wanted = {"Accept": "text/event-stream", **(headers or {})}
    with open_stream(url, token=token, headers=wanted, timeout=timeout) as reply:
        yield from read_events(reply)
