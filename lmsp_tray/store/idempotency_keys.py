"""Idempotency keys: run a request once, replay its result for a retry.

Why: `POST /responses` and `POST /tasks` take an ``Idempotency-Key``. The
first request with a key claims it (`begin` inserts an ``in_progress`` row
atomically — the single writer makes the check-and-insert race free); a
retry with the same body gets the stored result replayed, a different body
gets `422 idempotency_key_reused`, a retry while the first still runs gets
`409 idempotency_key_in_progress`. Keys are scoped (per token) and live
`IDEMPOTENCY_TTL_S` (24 h); an older row counts as absent and housekeeping
deletes it.

The stored ``result`` is whatever the service needs to replay, e.g.
``{"kind": "response", "status": 200, "body": {...}}``,
``{"kind": "stream", "owner_id": "resp_…"}`` (replayed from the event log)
or ``{"kind": "task", "task_id": "task_…"}``. Finish the key in the same
write that stores the result, so a crash cannot separate them.

All functions take a connection: call them through `Database.write`/`read`.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmsp_tray.store.errors import KeyInProgress, KeyReused

IDEMPOTENCY_TTL_S = 86400.0


@dataclass(frozen=True)
class IdempotencyRecord:
    scope: str
    key: str
    request_hash: str
    state: str  # "in_progress" | "done"
    created_at: float
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    is_new: bool = False  # True: this caller claimed the key and must finish or abandon it

    @property
    def replay(self) -> bool:
        """True: send ``result`` again instead of running the request."""
        return not self.is_new and self.state == "done"


def request_hash(body: Any) -> str:
    """A stable digest of a request body (key order and whitespace do not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _record(row: sqlite3.Row | tuple, *, is_new: bool = False) -> IdempotencyRecord:
    scope, key, digest, state, created, finished, result = tuple(row)
    return IdempotencyRecord(
        scope, key, digest, state, created, finished, None if result is None else json.loads(result), is_new
    )


def get(conn: sqlite3.Connection, scope: str, key: str) -> IdempotencyRecord | None:
    """The row as stored (expired or not), or None."""
    row = conn.execute(
        "SELECT scope, key, request_hash, state, created_at, finished_at, result_json FROM idempotency "
        "WHERE scope = ? AND key = ?",
        (scope, key),
    ).fetchone()
    return _record(row) if row is not None else None


def begin(
    conn: sqlite3.Connection,
    scope: str,
    key: str,
    request_hash: str,
    *,
    now: float | None = None,
    ttl_s: float = IDEMPOTENCY_TTL_S,
) -> IdempotencyRecord:
    """Claim the key, or return the finished original to replay.

    Returns a record with ``is_new=True`` when this request claimed the key
    (run it, then `finish` or `abandon`), or the stored record with
    ``replay=True``. Raises `KeyReused` when the key was used with a different
    body, `KeyInProgress` while the first request with this body still runs.
    """
    now = time.time() if now is None else now
    existing = get(conn, scope, key)
    if existing is not None and existing.created_at > now - ttl_s:
        if existing.request_hash != request_hash:
            raise KeyReused(key)
        if existing.state == "in_progress":
            raise KeyInProgress(key)
        return existing
    conn.execute(
        "INSERT OR REPLACE INTO idempotency (scope, key, request_hash, state, created_at, finished_at, result_json) "
        "VALUES (?, ?, ?, 'in_progress', ?, NULL, NULL)",
        (scope, key, request_hash, now),
    )
    return IdempotencyRecord(scope, key, request_hash, "in_progress", now, is_new=True)


def finish(
    conn: sqlite3.Connection, scope: str, key: str, result: Mapping[str, Any], *, now: float | None = None
) -> bool:
    """Record the result of the request that claimed the key; False if the key is not in progress."""
    now = time.time() if now is None else now
    cur = conn.execute(
        "UPDATE idempotency SET state = 'done', finished_at = ?, result_json = ? "
        "WHERE scope = ? AND key = ? AND state = 'in_progress'",
        (now, json.dumps(dict(result), separators=(",", ":"), ensure_ascii=False), scope, key),
    )
    return cur.rowcount > 0


def abandon(conn: sqlite3.Connection, scope: str, key: str) -> bool:
    """Release a claimed key (the request failed before producing anything); a retry runs anew."""
    cur = conn.execute("DELETE FROM idempotency WHERE scope = ? AND key = ? AND state = 'in_progress'", (scope, key))
    return cur.rowcount > 0
