"""Stored responses (`store: true`) and the conversation chains they form.

Why: `GET /responses/{id}` returns a stored response, `DELETE` removes one,
and `previous_response_id` continues from one: the model's context is the
chain of stored turns — each turn's own input items, then its output items —
oldest first, followed by the new input. Each row keeps only its turn's new
input, so a long conversation costs linear, not quadratic, space.

`chain` walks ``previous_response_id`` links in one recursive query with a
length guard; a link to a response that was deleted (or never stored) is an
error rather than a silently shortened context.

All functions take a connection: call them through `Database.write`/`read`.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from lmsp_tray.store.errors import ChainBroken, ChainCycle, ChainTooLong, ResponseMissing

MAX_CHAIN = 1000  # turns; a longer conversation cannot fit any context window anyway


@dataclass(frozen=True)
class StoredResponse:
    id: str
    model: str
    created_at: float
    status: str
    input_items: list[dict[str, Any]] = field(repr=False)  # this turn's new input, as the client sent it
    response: dict[str, Any] = field(repr=False)  # the whole response object, as returned
    previous_response_id: str | None = None
    owner: str | None = None  # the token id that created it

    @property
    def output_items(self) -> list[dict[str, Any]]:
        return list(self.response.get("output") or [])


@dataclass(frozen=True)
class Turn:
    response_id: str
    input_items: list[dict[str, Any]]
    output_items: list[dict[str, Any]]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def save(conn: sqlite3.Connection, stored: StoredResponse) -> None:
    """Insert the response, or replace a response with the same id."""
    conn.execute(
        "INSERT INTO responses (id, created_at, model, status, previous_response_id, owner, input_json, "
        "response_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
        "created_at = excluded.created_at, model = excluded.model, status = excluded.status, "
        "previous_response_id = excluded.previous_response_id, owner = excluded.owner, "
        "input_json = excluded.input_json, response_json = excluded.response_json",
        (
            stored.id,
            stored.created_at,
            stored.model,
            stored.status,
            stored.previous_response_id,
            stored.owner,
            _dumps(list(stored.input_items)),
            _dumps(dict(stored.response)),
        ),
    )


def get(conn: sqlite3.Connection, response_id: str, *, owner: str | None = None) -> StoredResponse | None:
    """The stored response, or None (also when ``owner`` is given and is not its owner)."""
    row = conn.execute(
        "SELECT id, model, created_at, status, input_json, response_json, previous_response_id, owner "
        "FROM responses WHERE id = ?",
        (response_id,),
    ).fetchone()
    if row is None or (owner is not None and row["owner"] != owner):
        return None
    return StoredResponse(
        id=row["id"],
        model=row["model"],
        created_at=row["created_at"],
        status=row["status"],
        input_items=json.loads(row["input_json"]),
        response=json.loads(row["response_json"]),
        previous_response_id=row["previous_response_id"],
        owner=row["owner"],
    )


def delete(conn: sqlite3.Connection, response_id: str, *, owner: str | None = None) -> bool:
    """Remove one stored response; False when there was none (for this owner)."""
    if owner is None:
        cur = conn.execute("DELETE FROM responses WHERE id = ?", (response_id,))
    else:
        cur = conn.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
    return cur.rowcount > 0


def chain(
    conn: sqlite3.Connection, response_id: str, *, owner: str | None = None, max_turns: int = MAX_CHAIN
) -> list[Turn]:
    """The turns ending with ``response_id``, oldest first.

    Raises `ResponseMissing` when ``response_id`` is not stored (for this
    owner), `ChainBroken` when an earlier link is missing or another owner's,
    `ChainTooLong` when the chain is longer than ``max_turns``, and
    `ChainCycle` when its links lead back to one of its turns.
    """
    rows = conn.execute(
        """WITH RECURSIVE walk (id, prev, owner, input_json, response_json, depth) AS (
               SELECT id, previous_response_id, owner, input_json, response_json, 0
                 FROM responses WHERE id = ?
               UNION ALL
               SELECT r.id, r.previous_response_id, r.owner, r.input_json, r.response_json, walk.depth + 1
                 FROM responses AS r JOIN walk ON r.id = walk.prev
                WHERE walk.depth < ?
           )
           SELECT id, prev, owner, input_json, response_json, depth FROM walk ORDER BY depth""",
        (response_id, max_turns),
    ).fetchall()
    if not rows or (owner is not None and rows[0]["owner"] != owner):
        raise ResponseMissing(response_id)
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise ChainCycle(response_id)
        seen.add(row["id"])
        if owner is not None and row["owner"] != owner:
            raise ChainBroken(response_id, None)
    if len(rows) > max_turns:
        raise ChainTooLong(response_id, max_turns)
    last = rows[-1]
    if last["prev"] is not None:
        raise ChainBroken(response_id, last["prev"])
    turns = []
    for row in reversed(rows):
        response = json.loads(row["response_json"])
        turns.append(Turn(row["id"], json.loads(row["input_json"]), list(response.get("output") or [])))
    return turns


def context_items(turns: list[Turn]) -> list[dict[str, Any]]:
    """The items of a chain in order: each turn's input, then its output."""
    items: list[dict[str, Any]] = []
    for turn in turns:
        items.extend(turn.input_items)
        items.extend(turn.output_items)
    return items
