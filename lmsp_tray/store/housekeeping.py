"""Housekeeping: keep the database bounded without blocking requests.

Why: events, idempotency keys and (optionally) stored responses and
finished tasks pile up forever unless something removes them. `purge` does
it in small steps — each one a separate short write transaction of at most
``batch_size`` rows — so queued request writes interleave with it and the
writer is never held for long. Event logs are expired before their events
are deleted, so readers get `410 event_history_expired` rather than a log
with a hole; a task keeps its result after its events are gone. Freed pages
are handed back to the file system with ``PRAGMA incremental_vacuum``.

`Housekeeper` is the background thread the daemon starts and stops: every
few seconds it writes batched token last-used times, and every
``interval_s`` it runs `purge`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from lmsp_tray.store.access_tokens import LastUsedBatcher
from lmsp_tray.store.database import Database
from lmsp_tray.store.idempotency_keys import IDEMPOTENCY_TTL_S

log = logging.getLogger(__name__)

EVENT_RETENTION_S = 86400.0
VACUUM_PAGES = 1024  # pages handed back per step (4 MiB with the default page size)


@dataclass
class PurgeReport:
    logs_expired: int = 0
    events: int = 0
    idempotency_keys: int = 0
    responses: int = 0
    tasks: int = 0
    pages_freed: int = 0
    steps: int = 0  # write transactions used

    def __add__(self, other: PurgeReport) -> PurgeReport:
        return PurgeReport(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def _expire_logs(conn: sqlite3.Connection, now: float, task_cutoff: float, response_cutoff: float, limit: int) -> int:
    return conn.execute(
        """UPDATE event_logs SET expired_at = ?
            WHERE owner_id IN (
                SELECT owner_id FROM event_logs
                 WHERE expired_at IS NULL AND closed_at IS NOT NULL
                   AND closed_at <= CASE kind WHEN 'task' THEN ? ELSE ? END
                 LIMIT ?)""",
        (now, task_cutoff, response_cutoff, limit),
    ).rowcount


def _delete_expired_events(conn: sqlite3.Connection, now: float, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` events of expired logs; returns (events deleted, logs finished)."""
    budget, deleted, finished = limit, 0, 0
    owners = conn.execute(
        "SELECT owner_id, kind FROM event_logs WHERE expired_at IS NOT NULL AND purged_at IS NULL LIMIT ?",
        (limit,),
    ).fetchall()
    for owner_id, kind in owners:
        n = conn.execute(
            "DELETE FROM events WHERE owner_id = ? AND seq IN "
            "(SELECT seq FROM events WHERE owner_id = ? ORDER BY seq LIMIT ?)",
            (owner_id, owner_id, budget),
        ).rowcount
        deleted += n
        if n < budget:  # none left
            if kind == "response":  # nothing refers to a direct stream's log any more
                conn.execute("DELETE FROM event_logs WHERE owner_id = ?", (owner_id,))
            else:  # a task's log stays while the task does: it answers 410 and knows last_seq
                conn.execute("UPDATE event_logs SET purged_at = ? WHERE owner_id = ?", (now, owner_id))
            finished += 1
        budget -= n
        if budget <= 0:
            break
    return deleted, finished


def _purge_tasks(conn: sqlite3.Connection, cutoff: float, limit: int) -> int:
    ids = [
        r[0]
        for r in conn.execute(
            """SELECT t.id FROM tasks AS t LEFT JOIN event_logs AS l ON l.owner_id = t.id
                WHERE t.finished_at IS NOT NULL AND t.finished_at <= ?
                  AND (l.owner_id IS NULL OR l.purged_at IS NOT NULL)
                LIMIT ?""",
            (cutoff, limit),
        )
    ]
    for task_id in ids:
        conn.execute("DELETE FROM event_logs WHERE owner_id = ?", (task_id,))
        conn.execute("DELETE FROM tasks WHERE id = ?", (task_id,))
    return len(ids)


def _purge_idempotency(conn: sqlite3.Connection, cutoff: float, limit: int) -> int:
    return conn.execute(
        "DELETE FROM idempotency WHERE (scope, key) IN "
        "(SELECT scope, key FROM idempotency WHERE created_at <= ? LIMIT ?)",
        (cutoff, limit),
    ).rowcount


def _purge_responses(conn: sqlite3.Connection, cutoff: float, limit: int) -> int:
    return conn.execute(
        "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE created_at <= ? LIMIT ?)",
        (cutoff, limit),
    ).rowcount


def _vacuum_step(conn: sqlite3.Connection, pages: int) -> int:
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    if free == 0 or int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
        return 0
    conn.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
    return free - int(conn.execute("PRAGMA freelist_count").fetchone()[0])


def purge(
    db: Database,
    *,
    now: float | None = None,
    event_retention_s: float = EVENT_RETENTION_S,
    idempotency_ttl_s: float = IDEMPOTENCY_TTL_S,
    response_ttl_s: float | None = None,
    task_ttl_s: float | None = None,
    batch_size: int = 500,
    stop: threading.Event | None = None,
) -> PurgeReport:
    """Remove what is past its time, one short write at a time; returns what was removed.

    - events of logs closed more than ``event_retention_s`` ago (task logs)
      or ``idempotency_ttl_s`` ago (direct-stream logs kept for replays);
    - idempotency keys older than ``idempotency_ttl_s``;
    - stored responses older than ``response_ttl_s`` (None: keep them);
    - finished tasks older than ``task_ttl_s`` (None: keep them), with their logs.
    """
    now = time.time() if now is None else now
    report = PurgeReport()
    task_window = event_retention_s if task_ttl_s is None else min(event_retention_s, task_ttl_s)

    def steps(fn: Callable[[sqlite3.Connection], int]) -> int:
        total = 0
        while not (stop is not None and stop.is_set()):
            n = db.write_sync(fn)
            report.steps += 1
            total += n
            if n == 0:
                break
        return total

    report.logs_expired = steps(lambda c: _expire_logs(c, now, now - task_window, now - idempotency_ttl_s, batch_size))

    while not (stop is not None and stop.is_set()):
        deleted, finished = db.write_sync(_delete_expired_events, now, batch_size)
        report.steps += 1
        report.events += deleted
        if deleted + finished == 0:
            break
    if task_ttl_s is not None:
        report.tasks = steps(lambda c: _purge_tasks(c, now - task_ttl_s, batch_size))
    report.idempotency_keys = steps(lambda c: _purge_idempotency(c, now - idempotency_ttl_s, batch_size))
    if response_ttl_s is not None:
        report.responses = steps(lambda c: _purge_responses(c, now - response_ttl_s, batch_size))
    if report.events or report.tasks or report.idempotency_keys or report.responses:
        report.pages_freed = steps(lambda c: _vacuum_step(c, VACUUM_PAGES))
    return report


class Housekeeper:
    """A background thread: flushes token last-used times often, purges every ``interval_s``."""

    def __init__(
        self,
        db: Database,
        *,
        event_retention_s: float = EVENT_RETENTION_S,
        idempotency_ttl_s: float = IDEMPOTENCY_TTL_S,
        response_ttl_s: float | None = None,
        task_ttl_s: float | None = None,
        interval_s: float = 600.0,
        flush_interval_s: float = 10.0,
        batch_size: int = 500,
        last_used: LastUsedBatcher | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.event_retention_s = event_retention_s
        self.idempotency_ttl_s = idempotency_ttl_s
        self.response_ttl_s = response_ttl_s
        self.task_ttl_s = task_ttl_s
        self.interval_s = interval_s
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.last_used = last_used
        self.clock = clock
        self.last_report: PurgeReport | None = None
        self.purges = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now: float | None = None) -> PurgeReport:
        """Flush last-used times and purge now (also what the thread does each interval)."""
        if self.last_used is not None:
            self.last_used.flush(self.db)
        report = purge(
            self.db,
            now=self.clock() if now is None else now,
            event_retention_s=self.event_retention_s,
            idempotency_ttl_s=self.idempotency_ttl_s,
            response_ttl_s=self.response_ttl_s,
            task_ttl_s=self.task_ttl_s,
            batch_size=self.batch_size,
            stop=self._stop,
        )
        self.last_report = report
        self.purges += 1
        return report

    def start(self) -> Housekeeper:
        if self._thread is not None:
            raise RuntimeError("the housekeeper is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="lmsp-store-housekeeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the thread (an unfinished purge stops between steps) and write pending last-used times."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.last_used is not None and not self.db.closed:
            try:
                self.last_used.flush(self.db)
            except Exception:
                log.exception("housekeeping: could not write token last-used times")

    def _loop(self) -> None:
        next_purge = time.monotonic()  # purge once soon after start
        tick = max(0.01, min(self.flush_interval_s, self.interval_s))
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_purge:
                    next_purge = time.monotonic() + self.interval_s
                    self.run_once()
                elif self.last_used is not None:
                    self.last_used.flush(self.db)
            except Exception:
                self.errors += 1
                log.exception("housekeeping failed; will try again")
            self._stop.wait(tick)
