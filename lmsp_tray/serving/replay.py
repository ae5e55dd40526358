"""Idempotency-Key for `POST /responses`, `POST /tasks`, `POST /models/pull`: run once, replay after.

Why: a client that lost the connection retries with the same key and must
get the original result, not a second generation. The first request with a
key claims it (an ``in_progress`` row); a retry with the same body replays
the stored result (`Idempotent-Replayed: true`), a different body gets
`422 idempotency_key_reused`, a retry while the first still runs gets
`409 idempotency_key_in_progress`. Keys live 24 h.

Keys are scoped by `Caller.scope`: the token id once tokens exist,
``"anonymous"`` until then (see `lmsp_tray.http.routes.caller_of`). The
endpoint is part of the hashed body, so one key used on both endpoints is a
reuse, not a replay.

What is kept per kind of result:
- ``{"kind": "response", "status": 200, "body": {...}}`` — a sync response;
- ``{"kind": "stream", "owner_id": "resp_…"}`` — a streamed response whose
  events are in the event log under the response id (written as they were
  sent, the terminal one together with this result, in one transaction);
- ``{"kind": "task", "task_id": "task_…"}`` — the task created (a response
  task or a model download); a replay answers with the task as it is now.
A request that fails before producing a result, is cancelled (its client
left) or ends `failed` releases its key, so a retry runs anew.
"""

from __future__ import annotations

import asyncio
import logging
import string
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from lmsp_tray.errors import EventHistoryExpired, InvalidRequest
from lmsp_tray.protocol.events import Event
from lmsp_tray.serving import storage
from lmsp_tray.store import Database, event_log
from lmsp_tray.store import idempotency_keys as idempotency
from lmsp_tray.store.errors import EventsExpired, StoreError
from lmsp_tray.store.idempotency_keys import IDEMPOTENCY_TTL_S

log = logging.getLogger("lmsp_tray.serving.replay")

MAX_KEY_LENGTH = 255
_KEY_CHARS = frozenset(string.printable) - frozenset("\t\n\r\x0b\x0c")


@dataclass(frozen=True)
class Caller:
    """Who is asking: `scope` partitions idempotency keys, `owner` is stored with responses and tasks."""

    scope: str = "anonymous"
    owner: str | None = None


ANONYMOUS = Caller()


@dataclass(frozen=True)
class Claim:
    """This request owns the key: finish it with a result or release it."""

    scope: str
    key: str


@dataclass(frozen=True)
class Replay:
    """The key was used before with this body: answer with `result` instead of running again."""

    result: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.result.get("kind"))


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH or not set(key) <= _KEY_CHARS:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable ASCII characters (a UUID or ULID is typical).",
            param="Idempotency-Key",
        )
    return key


class Idempotency:
    def __init__(self, db: Database, *, ttl_s: float = IDEMPOTENCY_TTL_S) -> None:
        self.db = db
        self.ttl_s = ttl_s

    async def claim(self, caller: Caller, key: str, endpoint: str, body: Any, *, large: bool = False) -> Claim | Replay:
        """Claim ``key`` for this request, or get the original's result (raises 422 / 409).

        A `large` body is hashed off the event loop."""
        check_key(key)
        canonical = {"endpoint": endpoint, "body": body}
        if large:
            digest = await asyncio.to_thread(idempotency.request_hash, canonical)
        else:
            digest = idempotency.request_hash(canonical)
        record = await storage.write(self.db, idempotency.begin, caller.scope, key, digest, ttl_s=self.ttl_s)
        if record.is_new:
            return Claim(caller.scope, key)
        assert record.result is not None
        return Replay(record.result)

    def release(self, claim: Claim) -> None:
        """Give the key up (fire and forget: safe from `finally` blocks and cancelled tasks)."""
        background(self.db, idempotency.abandon, claim.scope, claim.key)

    async def replay_events(self, owner_id: str) -> list[Event]:
        """The events of a streamed original, as they were sent."""
        expired = EventHistoryExpired(
            "The events of the original streamed response are no longer kept; send the request with a new key."
        )
        try:
            events = await self.db.aread(logged_events, owner_id)
        except EventsExpired:
            raise expired from None
        except StoreError as exc:
            raise storage.lmsp_error(exc) from exc
        if not events or not events[-1].terminal:
            raise expired
        return events


def logged_events(conn: Any, owner_id: str) -> list[Event]:
    """A read function: an owner's logged events, decoded on the reader thread (a long stream is thousands)."""
    return [Event(e.seq, e.event, e.payload()) for e in event_log.read_events(conn, owner_id)]


async def iterate(events: list[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


def background(db: Database, fn: Any, *args: Any, **kwargs: Any) -> Future | None:
    """Queue a write without waiting for it; a failure is logged, never raised."""
    try:
        future = db.write(fn, *args, **kwargs)
    except Exception:
        log.warning("could not queue a store write (%s)", getattr(fn, "__name__", fn), exc_info=True)
        return None
    future.add_done_callback(_log_failure)
    return future


def _log_failure(future: Future) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("a background store write failed: %s", exc)
