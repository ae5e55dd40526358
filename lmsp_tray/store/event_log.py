"""The event log: every streamed event, stored before it is sent.

Why: a task's events must survive a restart and be readable again from any
point (`Last-Event-ID`), and an idempotent replay of a streamed response must
send the very same events. Each owner — a task id (``task_…``) or a response
id (``resp_…``) — has one log whose event ids run 1, 2, 3, … with no gap:
`append_events` refuses a duplicate or a gap, and refuses anything after the
terminal event, so a log holds at most one terminal event and it is last.

A log is *closed* when its terminal event is appended (or its task
finishes); housekeeping expires closed logs after the retention period by
marking them expired first and deleting their events afterwards, so a reader
sees either the whole log or `410 event_history_expired`, never a log with a
hole at the start.

All functions take a connection: call them through `Database.write`/`read`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lmsp_tray.protocol.events import TERMINAL_EVENTS
from lmsp_tray.store.errors import DuplicateEvent, EventSequenceError, EventsExpired


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    event: str
    data: str  # the JSON text, exactly as it is sent in the SSE `data:` field
    created_at: float

    def payload(self) -> Any:
        return json.loads(self.data)


@dataclass(frozen=True)
class EventLog:
    owner_id: str
    kind: str  # "task" | "response"
    last_seq: int
    created_at: float
    closed_at: float | None
    expired_at: float | None

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    @property
    def expired(self) -> bool:
        return self.expired_at is not None


def log_kind(owner_id: str) -> str:
    return "task" if owner_id.startswith("task_") else "response"


def _dump(data: str | Mapping[str, Any]) -> str:
    if isinstance(data, str):
        return data
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def get_log(conn: sqlite3.Connection, owner_id: str) -> EventLog | None:
    row = conn.execute(
        "SELECT owner_id, kind, last_seq, created_at, closed_at, expired_at FROM event_logs WHERE owner_id = ?",
        (owner_id,),
    ).fetchone()
    return EventLog(*row) if row is not None else None


def _ensure_log(conn: sqlite3.Connection, owner_id: str, now: float) -> EventLog:
    log = get_log(conn, owner_id)
    if log is None:
        conn.execute(
            "INSERT INTO event_logs (owner_id, kind, last_seq, created_at) VALUES (?, ?, 0, ?)",
            (owner_id, log_kind(owner_id), now),
        )
        log = EventLog(owner_id, log_kind(owner_id), 0, now, None, None)
    return log


def append_events(
    conn: sqlite3.Connection,
    owner_id: str,
    events: Iterable[tuple[int, str, str | Mapping[str, Any]]],
    *,
    now: float | None = None,
) -> int:
    """Append ``(seq, event_name, data)`` tuples; seqs must continue the log exactly. Returns the last seq.

    ``data`` is JSON text or a mapping (dumped compactly). A terminal event
    (`TERMINAL_EVENTS`) closes the log and must be the last one appended.
    """
    now = time.time() if now is None else now
    batch = [(int(seq), str(name), _dump(data)) for seq, name, data in events]
    if not batch:
        return last_event_seq(conn, owner_id)
    log = _ensure_log(conn, owner_id, now)
    if log.expired:
        raise EventSequenceError(f"the event log of {owner_id} has expired")
    if log.closed:
        raise EventSequenceError(f"the event log of {owner_id} already ended with its terminal event")
    expected = log.last_seq + 1
    for index, (seq, name, _data) in enumerate(batch):
        if seq < expected:
            raise DuplicateEvent(f"event {seq} of {owner_id} is already stored")
        if seq > expected:
            raise EventSequenceError(f"event {seq} of {owner_id} would leave a gap (next is {expected})")
        if name in TERMINAL_EVENTS and index != len(batch) - 1:
            raise EventSequenceError(f"terminal event {name} of {owner_id} must be the last event")
        expected += 1
    last = expected - 1
    conn.executemany(
        "INSERT INTO events (owner_id, seq, event, data, created_at) VALUES (?, ?, ?, ?, ?)",
        [(owner_id, seq, name, data, now) for seq, name, data in batch],
    )
    closes = batch[-1][1] in TERMINAL_EVENTS
    conn.execute(
        "UPDATE event_logs SET last_seq = ?, closed_at = CASE WHEN ? THEN ? ELSE closed_at END WHERE owner_id = ?",
        (last, closes, now, owner_id),
    )
    return last


def close_log(conn: sqlite3.Connection, owner_id: str, *, now: float | None = None) -> None:
    """Mark a log closed (its retention clock starts) even if no terminal event was appended."""
    now = time.time() if now is None else now
    _ensure_log(conn, owner_id, now)
    conn.execute("UPDATE event_logs SET closed_at = ? WHERE owner_id = ? AND closed_at IS NULL", (now, owner_id))


def read_events(
    conn: sqlite3.Connection, owner_id: str, after_seq: int = 0, *, limit: int | None = None
) -> list[StoredEvent]:
    """Events with id > ``after_seq``, in order. Unknown owner: ``[]``.

    Raises `EventsExpired` when the log has expired and the reader still
    lacks some of its events.
    """
    log = get_log(conn, owner_id)
    if log is None:
        return []
    if log.expired:
        if after_seq < log.last_seq:
            raise EventsExpired(owner_id)
        return []
    sql = "SELECT seq, event, data, created_at FROM events WHERE owner_id = ? AND seq > ? ORDER BY seq"
    params: tuple[Any, ...] = (owner_id, max(0, int(after_seq)))
    if limit is not None:
        sql += " LIMIT ?"
        params += (int(limit),)
    return [StoredEvent(*row) for row in conn.execute(sql, params)]


def last_event_seq(conn: sqlite3.Connection, owner_id: str) -> int:
    """The id of the owner's last event (0 when it has none); still known after expiry."""
    row = conn.execute("SELECT last_seq FROM event_logs WHERE owner_id = ?", (owner_id,)).fetchone()
    return int(row[0]) if row is not None else 0
