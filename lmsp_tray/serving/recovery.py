"""Ending tasks from what their event log holds: after a crash, and when a task cannot go on.

Why: when the daemon dies (SIGKILL, power loss) a running task's log stops
mid-stream. On the next start, before serving, `recover` ends every such
task `failed` with code `service_restarted` and a `response.failed` event
appended right after its last logged event — one write per task, so a
second crash cannot leave two terminal events — and returns the queued
tasks for the task manager to run. The response is resumed from the logged
events (`ResponseAssembler.resume`) and ended by the same assembler a live
response uses: the item that was open is closed `incomplete` with the output
produced before the crash, then the terminal event with the whole response.
A task whose log is empty gets `response.created` first, so its stream is
well-formed from id 1.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from lmsp_tray.errors import ServiceRestarted
from lmsp_tray.protocol.events import Event, ResponseAssembler
from lmsp_tray.protocol.states import TaskStatus
from lmsp_tray.store import Database, event_log
from lmsp_tray.store import task_rows as task_store
from lmsp_tray.store.task_rows import TaskRecord

log = logging.getLogger("lmsp_tray.serving.recovery")


def resumed(task: TaskRecord, logged: list[event_log.StoredEvent]) -> ResponseAssembler:
    """The task's response as far as its logged events go, ready to be ended like a live one."""
    return ResponseAssembler.resume(
        (Event(e.seq, e.event, e.payload()) for e in logged),
        str(task.request.get("model", "")),
        response_id=task.response_id,
        created_at=int(task.created_at),
    )


def end_task(
    conn: sqlite3.Connection,
    task_id: str,
    status: TaskStatus,
    error: dict[str, Any] | None = None,
    *,
    now: float | None = None,
) -> list[Event] | None:
    """End a not-yet-terminal task `failed` (with ``error``) or `cancelled`, after its last logged event.

    A write function. The item that was open when the log stopped is closed
    `incomplete` with the output it had. Returns the events appended, or None
    when the task had already ended (nothing written).
    """
    if status not in (TaskStatus.FAILED, TaskStatus.CANCELLED):
        raise ValueError(f"a task is ended 'failed' or 'cancelled', not {status!r}")
    task = task_store.get(conn, task_id)
    if task is None or task.terminal:
        return None
    logged = event_log.read_events(conn, task_id) if event_log.last_event_seq(conn, task_id) else []
    asm = resumed(task, logged)
    events = [] if asm.started else asm.start()
    events += asm.close_item("incomplete")
    events += asm.fail(error or {}) if status == TaskStatus.FAILED else asm.cancel()
    task_store.finish(
        conn,
        task_id,
        status,
        response=asm.response(),
        error=error if status == TaskStatus.FAILED else None,
        events=[(e.id, e.name, e.data) for e in events],
        now=now,
    )
    return events


def end_with_error(conn: sqlite3.Connection, task_id: str, error: dict[str, Any]) -> list[Event] | None:
    return end_task(conn, task_id, TaskStatus.FAILED, error)


def recover(db: Database) -> list[TaskRecord]:
    """Run once at start-up, before serving: end interrupted tasks; return the queued ones, oldest first."""
    found = db.write_sync(task_store.recover_after_crash)
    problem = ServiceRestarted(
        "The service stopped unexpectedly while this task was running; its output so far is in the response. "
        "Create the task again to get a complete answer."
    ).to_problem()
    for task in found.interrupted:
        if task.kind == task_store.RESPONSE:  # other kinds resume themselves (`downloads.DownloadTasks.recover`)
            db.write_sync(end_with_error, task.id, problem)
    if found.interrupted or found.queued or found.abandoned_keys:
        log.info(
            "recovered after an unclean stop: %d task(s) ended service_restarted, %d queued task(s) to run, "
            "%d idempotency key(s) released",
            len(found.interrupted),
            len(found.queued),
            found.abandoned_keys,
        )
    return [t for t in found.queued if t.kind == task_store.RESPONSE]
