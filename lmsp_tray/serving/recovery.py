"""Ending tasks from what their event log holds: after a crash, and when a task cannot go on.

Why: when the daemon dies (SIGKILL, power loss) a running task's log stops
mid-stream. On the next start, before serving, `recover` ends every such
task `failed` with code `service_restarted` and a `response.failed` event
appended right after its last logged event — one write per task, so a
second crash cannot leave two terminal events — and returns the queued
tasks for the task manager to run. The response object in that terminal
event is rebuilt from the logged events, so a reader sees the output that
was produced before the crash. A task whose log is empty gets
`response.created` first, so its stream is well-formed from id 1.
"""

from __future__ import annotations

import copy
import json
import logging
import sqlite3
from typing import Any

from lmsp_tray.errors import ServiceRestarted
from lmsp_tray.protocol.events import Event
from lmsp_tray.store import Database, event_log
from lmsp_tray.store import task_rows as task_store
from lmsp_tray.store.task_rows import TaskRecord

log = logging.getLogger("lmsp_tray.serving.recovery")

TERMINAL_NAMES = {"failed": "response.failed", "cancelled": "response.cancelled"}


def rebuild_response(task: TaskRecord, logged: list[event_log.StoredEvent]) -> dict[str, Any]:
    """The task's response object as far as its logged events go (status still `in_progress`)."""
    response: dict[str, Any] | None = None
    output: dict[int, dict[str, Any]] = {}
    texts: dict[int, list[str]] = {}
    for stored in logged:
        data = stored.payload()
        if stored.event == "response.created" and isinstance(data.get("response"), dict):
            response = copy.deepcopy(data["response"])
        elif stored.event in ("response.output_item.added", "response.output_item.done"):
            output[int(data["output_index"])] = data["item"]
            if stored.event.endswith(".done"):
                texts.pop(int(data["output_index"]), None)
        elif stored.event == "response.output_text.delta":
            texts.setdefault(int(data["output_index"]), []).append(str(data.get("delta", "")))
    for index, parts in texts.items():  # an item still open when the log stopped
        item = output.get(index)
        if item is not None and item.get("type") == "message":
            item["content"] = [{"type": "output_text", "text": "".join(parts), "annotations": []}]
            item["status"] = "incomplete"
    if response is None:
        response = {
            "id": task.response_id,
            "object": "response",
            "created_at": int(task.created_at),
            "status": "in_progress",
            "model": task.request.get("model"),
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
        }
    response["output"] = [output[i] for i in sorted(output)]
    return response


def end_task(
    conn: sqlite3.Connection,
    task_id: str,
    status: str,
    error: dict[str, Any] | None = None,
    *,
    now: float | None = None,
) -> list[Event] | None:
    """End a not-yet-terminal task `failed` (with ``error``) or `cancelled`, after its last logged event.

    A write function. Returns the events appended, or None when the task
    had already ended (nothing written).
    """
    task = task_store.get(conn, task_id)
    if task is None or task.terminal:
        return None
    logged = event_log.read_events(conn, task_id) if event_log.last_event_seq(conn, task_id) else []
    response = rebuild_response(task, logged)
    rid = response.get("id") or task.response_id
    events: list[Event] = []
    seq = logged[-1].seq if logged else 0
    if not logged:
        seq += 1
        events.append(
            Event(
                seq,
                "response.created",
                {
                    "type": "response.created",
                    "sequence_number": seq,
                    "response_id": rid,
                    "status": "in_progress",
                    "response": copy.deepcopy(response),
                },
            )
        )
    response["status"] = status
    response["error"] = error if status == "failed" else None
    name = TERMINAL_NAMES[status]
    seq += 1
    data: dict[str, Any] = {"type": name, "sequence_number": seq, "response_id": rid, "status": status}
    if status == "failed":
        data["error"] = error
    data["response"] = response
    events.append(Event(seq, name, data))
    task_store.finish(
        conn,
        task_id,
        status,
        response=response,
        error=error if status == "failed" else None,
        events=[(e.id, e.name, json.dumps(e.data, separators=(",", ":"), ensure_ascii=False)) for e in events],
        now=now,
    )
    return events


def end_with_error(conn: sqlite3.Connection, task_id: str, error: dict[str, Any]) -> list[Event] | None:
    return end_task(conn, task_id, "failed", error)


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
