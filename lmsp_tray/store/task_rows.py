"""Tasks: queued background responses, persisted so they survive a restart.

Why: `POST /tasks` answers at once and the work runs later; the task, its
request, its final response and its event log (`store.events`) are rows, so
after a crash finished tasks are still served, queued ones still run and the
one that was running can be ended honestly. `recover_after_crash` tells the
service which tasks were running or waiting when the daemon last died.

Ending an interrupted task (one write, so a second crash cannot leave two
terminal events)::

    def fail(conn):
        seq = events.last_event_seq(conn, task.id) + 1
        data = build_failed_event(task, seq)          # service: protocol knowledge
        return tasks.finish(conn, task.id, TaskStatus.FAILED, error=err, response=resp,
                            events=[(seq, "response.failed", data)])
    db.write_sync(fail)

All functions take a connection: call them through `Database.write`/`read`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lmsp_tray.protocol.states import TaskStatus
from lmsp_tray.store import event_log
from lmsp_tray.store.errors import TaskMissing, UnknownCursor, UnknownStatus

TASK_STATUSES = tuple(TaskStatus)
RESPONSE = "response"  # a background response (`POST /tasks`); other kinds: "model.download"
TERMINAL_STATUSES = frozenset(status for status in TaskStatus if status.terminal)


@dataclass(frozen=True)
class TaskRecord:
    id: str
    status: TaskStatus
    created_at: float
    updated_at: float
    request: dict[str, Any] = field(repr=False)
    response_id: str | None = None
    owner: str | None = None  # the token id that created it
    started_at: float | None = None
    finished_at: float | None = None
    response: dict[str, Any] | None = field(default=None, repr=False)  # a download: its result object
    error: dict[str, Any] | None = None
    kind: str = RESPONSE

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class TaskPage:
    items: list[TaskRecord]
    has_more: bool

    @property
    def last_id(self) -> str | None:
        """The cursor for the next page (pass it as ``after``)."""
        return self.items[-1].id if self.items else None


@dataclass(frozen=True)
class Recovery:
    """What `recover_after_crash` found."""

    interrupted: list[TaskRecord]  # were in_progress: end them failed / service_restarted
    queued: list[TaskRecord]  # still waiting: run them, oldest first
    abandoned_keys: int = 0  # idempotency keys whose request died with the daemon
    closed_streams: int = 0  # direct-stream event logs left open by the crash


_COLUMNS = (
    "id, status, created_at, updated_at, request_json, response_id, owner, started_at, finished_at, "
    "response_json, error_json, kind"
)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _record(row: sqlite3.Row | tuple) -> TaskRecord:
    (tid, status, created, updated, request, response_id, owner, started, finished, response, error, kind) = tuple(row)
    return TaskRecord(
        id=tid,
        status=TaskStatus(status),
        created_at=created,
        updated_at=updated,
        request=json.loads(request),
        response_id=response_id,
        owner=owner,
        started_at=started,
        finished_at=finished,
        response=_loads(response),
        error=_loads(error),
        kind=kind,
    )


def create(
    conn: sqlite3.Connection,
    task_id: str,
    request: Mapping[str, Any],
    *,
    response_id: str | None = None,
    owner: str | None = None,
    now: float | None = None,
    kind: str = RESPONSE,
) -> TaskRecord:
    """Insert a new ``queued`` task with its request body."""
    now = time.time() if now is None else now
    conn.execute(
        "INSERT INTO tasks (id, status, created_at, updated_at, request_json, response_id, owner, kind) "
        "VALUES (?, 'queued', ?, ?, ?, ?, ?, ?)",
        (task_id, now, now, _dumps(dict(request)), response_id, owner, kind),
    )
    return TaskRecord(task_id, TaskStatus.QUEUED, now, now, dict(request), response_id, owner, kind=kind)


def get(conn: sqlite3.Connection, task_id: str, *, owner: str | None = None) -> TaskRecord | None:
    """The task, or None (also when ``owner`` is given and is not the task's)."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None or (owner is not None and row["owner"] != owner):
        return None
    return _record(row)


def _require(conn: sqlite3.Connection, task_id: str) -> TaskRecord:
    record = get(conn, task_id)
    if record is None:
        raise TaskMissing(task_id)
    return record


def mark_in_progress(
    conn: sqlite3.Connection, task_id: str, *, response_id: str | None = None, now: float | None = None
) -> TaskRecord | None:
    """queued → in_progress. Returns the updated task, or None when it was not queued (e.g. cancelled)."""
    now = time.time() if now is None else now
    _require(conn, task_id)
    cur = conn.execute(
        "UPDATE tasks SET status = 'in_progress', started_at = ?, updated_at = ?, "
        "response_id = COALESCE(?, response_id) WHERE id = ? AND status = 'queued'",
        (now, now, response_id, task_id),
    )
    return get(conn, task_id) if cur.rowcount else None


def requeue(
    conn: sqlite3.Connection,
    task_id: str,
    *,
    events: Iterable[tuple[int, str, str | Mapping[str, Any]]] = (),
    now: float | None = None,
) -> TaskRecord | None:
    """in_progress → queued (a download paused by a stop, to resume at the next start), appending `events`.

    Returns the task, or None when it was not in progress (then nothing is written).
    """
    now = time.time() if now is None else now
    current = _require(conn, task_id)
    if current.status != TaskStatus.IN_PROGRESS:
        return None
    event_log.append_events(conn, task_id, events, now=now)
    conn.execute("UPDATE tasks SET status = 'queued', updated_at = ? WHERE id = ?", (now, task_id))
    return get(conn, task_id)


def set_result(conn: sqlite3.Connection, task_id: str, result: Mapping[str, Any], *, now: float | None = None) -> None:
    """Keep a running task's current result object (a download's progress), shown by `GET /tasks/{id}`."""
    now = time.time() if now is None else now
    conn.execute(
        "UPDATE tasks SET response_json = ?, updated_at = ? WHERE id = ? AND status IN ('queued', 'in_progress')",
        (_dumps(dict(result)), now, task_id),
    )


def finish(
    conn: sqlite3.Connection,
    task_id: str,
    status: TaskStatus,
    *,
    response: Mapping[str, Any] | None = None,
    error: Mapping[str, Any] | None = None,
    events: Iterable[tuple[int, str, str | Mapping[str, Any]]] = (),
    now: float | None = None,
) -> TaskRecord | None:
    """Queued or in_progress → a terminal status, appending ``events`` (e.g. the terminal one) first.

    Returns the updated task, or None when it had already ended (then nothing
    is written). The task's event log is closed: its retention starts now.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status!r} is not a terminal task status")
    now = time.time() if now is None else now
    current = _require(conn, task_id)
    if current.terminal:
        return None
    event_log.append_events(conn, task_id, events, now=now)
    conn.execute(
        "UPDATE tasks SET status = ?, updated_at = ?, finished_at = ?, response_json = ?, error_json = ? WHERE id = ?",
        (
            status,
            now,
            now,
            _dumps(None if response is None else dict(response)),
            _dumps(None if error is None else dict(error)),
            task_id,
        ),
    )
    event_log.close_log(conn, task_id, now=now)
    return get(conn, task_id)


def list_tasks(
    conn: sqlite3.Connection,
    *,
    status: str | Iterable[str] | None = None,
    owner: str | None = None,
    limit: int = 20,
    after: str | None = None,
) -> TaskPage:
    """Tasks newest first; ``after`` is the last id of the previous page."""
    where: list[str] = []
    params: list[Any] = []
    if status is not None:
        wanted = [status] if isinstance(status, str) else list(status)
        unknown = [s for s in wanted if s not in TASK_STATUSES]
        if unknown:
            raise UnknownStatus(unknown[0])
        where.append(f"status IN ({', '.join('?' for _ in wanted)})")
        params.extend(wanted)
    if owner is not None:
        where.append("owner = ?")
        params.append(owner)
    if after is not None:
        # Another owner's task is no cursor for this one: the same refusal as an unknown id (no oracle).
        anchor = conn.execute(
            "SELECT created_at, id FROM tasks WHERE id = ?" + ("" if owner is None else " AND owner = ?"),
            (after,) if owner is None else (after, owner),
        ).fetchone()
        if anchor is None:
            raise UnknownCursor(after)
        where.append("(created_at, id) < (?, ?)")
        params.extend([anchor[0], anchor[1]])
    limit = max(1, int(limit))
    sql = f"SELECT {_COLUMNS} FROM tasks"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
    rows = conn.execute(sql, (*params, limit + 1)).fetchall()
    return TaskPage([_record(r) for r in rows[:limit]], has_more=len(rows) > limit)


def unfinished(conn: sqlite3.Connection, *, kind: str) -> list[TaskRecord]:
    """The queued and running tasks of one kind, oldest first."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM tasks WHERE kind = ? AND status IN ('queued', 'in_progress') ORDER BY created_at, id",
        (kind,),
    ).fetchall()
    return [_record(r) for r in rows]


def recover_after_crash(conn: sqlite3.Connection, *, now: float | None = None) -> Recovery:
    """Run once at start-up, before serving: what the last run left unfinished.

    Returns the tasks that were ``in_progress`` (the service ends each with a
    ``response.failed`` event, code ``service_restarted``, and `finish`) and
    the ``queued`` ones (to run), both oldest first. It also drops
    idempotency keys still marked in progress (their request died with the
    daemon, so a retry may run again) and closes direct-stream event logs
    left open, so housekeeping can expire them. Tasks are not changed here.
    """
    now = time.time() if now is None else now
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM tasks WHERE status IN ('in_progress', 'queued') ORDER BY created_at, id"
    ).fetchall()  # every kind: the service decides what each kind does after a crash
    tasks = [_record(r) for r in rows]
    abandoned = conn.execute("DELETE FROM idempotency WHERE state = 'in_progress'").rowcount
    closed = conn.execute(
        "UPDATE event_logs SET closed_at = ? WHERE kind = 'response' AND closed_at IS NULL", (now,)
    ).rowcount
    return Recovery(
        interrupted=[t for t in tasks if t.status == TaskStatus.IN_PROGRESS],
        queued=[t for t in tasks if t.status == TaskStatus.QUEUED],
        abandoned_keys=abandoned,
        closed_streams=closed,
    )
