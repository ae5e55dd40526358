"""The database schema, built and upgraded by numbered migration functions.

Why: the file outlives any one version of lmsp-tray, so the schema must be
upgraded in place, never recreated. `MIGRATIONS` is an ordered tuple of
functions (``m001_initial``, ``m002_…``); migration *n* is applied in its own
transaction together with ``PRAGMA user_version = n``, so a crash leaves the
file either before or after a migration, never half way. ``user_version`` is
the single source of truth; the ``_migrations`` table only records when each
step ran. A file whose version is higher than the migrations this code knows
was written by a newer lmsp-tray: opening it raises `SchemaTooNew` instead of
guessing. Append new migrations at the end; never edit a released one.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lmsp_tray.store.errors import SchemaTooNew

Migration = Callable[[sqlite3.Connection], None]


def m001_initial(conn: sqlite3.Connection) -> None:
    """Responses, tasks, event logs, idempotency keys and token metadata."""
    conn.execute(
        """CREATE TABLE _migrations (
               version INTEGER PRIMARY KEY,
               name TEXT NOT NULL,
               applied_at REAL NOT NULL
           )"""
    )
    # Responses stored with `store: true`: the turn's own input items and the whole
    # response object (its `output` holds the output items).
    conn.execute(
        """CREATE TABLE responses (
               id TEXT PRIMARY KEY,
               created_at REAL NOT NULL,
               model TEXT NOT NULL,
               status TEXT NOT NULL,
               previous_response_id TEXT,
               owner TEXT,
               input_json TEXT NOT NULL,
               response_json TEXT NOT NULL
           )"""
    )
    conn.execute("CREATE INDEX responses_created ON responses (created_at)")
    conn.execute(
        """CREATE TABLE tasks (
               id TEXT PRIMARY KEY,
               status TEXT NOT NULL CHECK (status IN
                   ('queued', 'in_progress', 'completed', 'incomplete', 'failed', 'cancelled')),
               created_at REAL NOT NULL,
               updated_at REAL NOT NULL,
               started_at REAL,
               finished_at REAL,
               response_id TEXT,
               owner TEXT,
               request_json TEXT NOT NULL,
               response_json TEXT,
               error_json TEXT
           )"""
    )
    conn.execute("CREATE INDEX tasks_created ON tasks (created_at, id)")
    conn.execute("CREATE INDEX tasks_status_created ON tasks (status, created_at, id)")
    conn.execute("CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL")
    # One event log per owner (a task id, or a response id for replaying a streamed
    # idempotent request). last_seq survives the purge of the events themselves:
    # closed (terminal event stored) -> expired (readers get 410) -> purged (events deleted).
    conn.execute(
        """CREATE TABLE event_logs (
               owner_id TEXT PRIMARY KEY,
               kind TEXT NOT NULL CHECK (kind IN ('task', 'response')),
               last_seq INTEGER NOT NULL DEFAULT 0,
               created_at REAL NOT NULL,
               closed_at REAL,
               expired_at REAL,
               purged_at REAL
           )"""
    )
    conn.execute(
        "CREATE INDEX event_logs_closed ON event_logs (closed_at) WHERE expired_at IS NULL AND closed_at IS NOT NULL"
    )
    # Expired logs whose events housekeeping has not deleted yet.
    conn.execute(
        "CREATE INDEX event_logs_unpurged ON event_logs (expired_at) WHERE expired_at IS NOT NULL AND purged_at IS NULL"
    )
    conn.execute(
        """CREATE TABLE events (
               owner_id TEXT NOT NULL REFERENCES event_logs (owner_id) ON DELETE CASCADE,
               seq INTEGER NOT NULL CHECK (seq >= 1),
               event TEXT NOT NULL,
               data TEXT NOT NULL,
               created_at REAL NOT NULL,
               PRIMARY KEY (owner_id, seq)
           ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TABLE idempotency (
               scope TEXT NOT NULL,
               key TEXT NOT NULL,
               request_hash TEXT NOT NULL,
               state TEXT NOT NULL CHECK (state IN ('in_progress', 'done')),
               created_at REAL NOT NULL,
               finished_at REAL,
               result_json TEXT,
               PRIMARY KEY (scope, key)
           ) WITHOUT ROWID"""
    )
    conn.execute("CREATE INDEX idempotency_created ON idempotency (created_at)")
    conn.execute(
        """CREATE TABLE tokens (
               id TEXT PRIMARY KEY,
               name TEXT NOT NULL,
               scopes_json TEXT NOT NULL,
               created_at REAL NOT NULL,
               last_used_at REAL,
               secret_hash TEXT NOT NULL UNIQUE,
               revoked_at REAL
           )"""
    )


def m002_task_kind(conn: sqlite3.Connection) -> None:
    """Tasks of other kinds than a background response: model downloads (`kind = 'model.download'`)."""
    conn.execute("ALTER TABLE tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'response'")
    conn.execute("CREATE INDEX tasks_kind_status ON tasks (kind, status)")


MIGRATIONS: tuple[Migration, ...] = (m001_initial, m002_task_kind)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration], path: Path | str = "database") -> int:
    """Apply the migrations the file lacks, each in its own transaction; return the version.

    Safe to call on every start and from two processes at once (each step
    re-reads the version under the write lock). Raises `SchemaTooNew` for a
    file from a newer version, before changing anything.
    """
    known = len(migrations)
    current = schema_version(conn)
    if current > known:
        raise SchemaTooNew(Path(path), current, known)
    while current < known:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)  # another process may have migrated meanwhile
            if current > known:
                raise SchemaTooNew(Path(path), current, known)
            if current == known:
                conn.execute("COMMIT")
                break
            step = migrations[current]
            step(conn)
            version = current + 1
            conn.execute(f"PRAGMA user_version = {version}")
            if _has_log(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO _migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, getattr(step, "__name__", f"m{version:03d}"), time.time()),
                )
            conn.execute("COMMIT")
            current = version
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return current


def _has_log(conn: sqlite3.Connection) -> bool:
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'").fetchone() is not None
    )
