"""Token metadata: the store side of bearer tokens.

Why: the OS keyring holds token secrets; the daemon keeps only what it needs
to check a bearer token and show it to the user — id, name, scopes,
created/last-used times, revocation and a hash of the secret (hashing and
constant-time checks are `lmsp_tray.auth.tokens`' job; looking a row up by a
SHA-256 of a high-entropy secret leaks nothing through timing). The hash
never appears in a repr.

Recording "last used" on every request would cost a write (and an fsync)
per request, so `LastUsedBatcher` collects the times in memory and the
housekeeper writes them in one transaction every few seconds.

All functions take a connection: call them through `Database.write`/`read`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmsp_tray.store.database import Database


@dataclass(frozen=True)
class TokenRecord:
    id: str
    name: str
    scopes: tuple[str, ...]
    created_at: float
    secret_hash: str = field(repr=False)
    last_used_at: float | None = None
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


_COLUMNS = "id, name, scopes_json, created_at, secret_hash, last_used_at, revoked_at"


def _record(row: sqlite3.Row | tuple) -> TokenRecord:
    tid, name, scopes, created, digest, last_used, revoked = tuple(row)
    return TokenRecord(tid, name, tuple(json.loads(scopes)), created, digest, last_used, revoked)


def insert(conn: sqlite3.Connection, token: TokenRecord) -> None:
    conn.execute(
        f"INSERT INTO tokens ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            token.id,
            token.name,
            json.dumps(list(token.scopes)),
            token.created_at,
            token.secret_hash,
            token.last_used_at,
            token.revoked_at,
        ),
    )


def get(conn: sqlite3.Connection, token_id: str) -> TokenRecord | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM tokens WHERE id = ?", (token_id,)).fetchone()
    return _record(row) if row is not None else None


def get_by_hash(conn: sqlite3.Connection, secret_hash: str, *, include_revoked: bool = False) -> TokenRecord | None:
    """The token whose secret hashes to ``secret_hash``; revoked ones only when asked."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM tokens WHERE secret_hash = ?", (secret_hash,)).fetchone()
    if row is None:
        return None
    token = _record(row)
    return token if include_revoked or not token.revoked else None


def list_tokens(conn: sqlite3.Connection, *, include_revoked: bool = True) -> list[TokenRecord]:
    """All tokens, oldest first."""
    sql = f"SELECT {_COLUMNS} FROM tokens"
    if not include_revoked:
        sql += " WHERE revoked_at IS NULL"
    return [_record(r) for r in conn.execute(sql + " ORDER BY created_at, id")]


def touch(conn: sqlite3.Connection, token_id: str, *, now: float | None = None) -> None:
    touch_many(conn, {token_id: time.time() if now is None else now})


def touch_many(conn: sqlite3.Connection, last_used: Mapping[str, float]) -> int:
    """Move each token's last-used time forward (never back); returns how many rows changed."""
    changed = 0
    for token_id, when in last_used.items():
        cur = conn.execute(
            "UPDATE tokens SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)",
            (when, token_id, when),
        )
        changed += cur.rowcount
    return changed


def revoke(conn: sqlite3.Connection, token_id: str, *, now: float | None = None) -> bool:
    """Revoke a token; False when it is unknown or already revoked."""
    now = time.time() if now is None else now
    cur = conn.execute("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, token_id))
    return cur.rowcount > 0


def delete_revoked(conn: sqlite3.Connection, ids: Iterable[str]) -> int:
    """Forget revoked tokens for good (only those already revoked)."""
    total = 0
    for token_id in ids:
        total += conn.execute("DELETE FROM tokens WHERE id = ? AND revoked_at IS NOT NULL", (token_id,)).rowcount
    return total


class LastUsedBatcher:
    """Collects "token used at" times in memory; `flush` writes them in one transaction."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}

    def note(self, token_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            if now > self._pending.get(token_id, float("-inf")):
                self._pending[token_id] = now

    def pending(self, token_id: str) -> float | None:
        """A time noted but not yet written (to show the freshest value)."""
        with self._lock:
            return self._pending.get(token_id)

    def flush(self, db: Database) -> int:
        """Write what was noted; returns how many tokens were written."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        try:
            db.write_sync(touch_many, batch)
        except BaseException:
            with self._lock:  # keep them for the next flush
                for token_id, when in batch.items():
                    if when > self._pending.get(token_id, float("-inf")):
                        self._pending[token_id] = when
            raise
        return len(batch)
