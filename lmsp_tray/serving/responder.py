"""`POST /responses` with what surrounds a `ResponseRun`: conversations, storage and idempotency.

Why: the service only turns a request into events. Around it this module
expands `previous_response_id` (`conversations`), saves the finished turn
when `store: true`, and honours `Idempotency-Key` (`replay`), for sync and
streamed requests alike — without touching the database at all for a plain
request that asks for none of it.

Ordering rules:
- the stored response and the idempotency result are written in one
  transaction *before* the terminal event is handed to the client, so a
  client that has seen `response.completed` can at once continue the
  conversation, `GET` the response, or retry with the key and get a replay;
- a streamed request with a key also writes each event to the event log
  under the response id (queued behind the stream, not awaited, so the
  stream is not slowed by fsync); a retry replays exactly those events.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lmsp_tray.errors import IdempotencyKeyReused, InternalError, LMSPError
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.requests import ResponseRequest
from lmsp_tray.serving import storage
from lmsp_tray.serving.conversations import Conversations, PreparedRequest
from lmsp_tray.serving.replay import ANONYMOUS, Caller, Claim, Idempotency, Replay, background
from lmsp_tray.serving.running import Responses, Run
from lmsp_tray.store import Database, event_log, stored_responses
from lmsp_tray.store import idempotency_keys as idempotency
from lmsp_tray.store.errors import EventSequenceError, StoreError

log = logging.getLogger("lmsp_tray.serving.responder")

KEPT_STATUSES = frozenset({"completed", "incomplete"})  # results a key replays; others release it


class Started:
    """A response that is running: its events (with persistence applied) or its final object."""

    def __init__(
        self,
        run: Run,
        prepared: PreparedRequest,
        *,
        db: Database | None,
        claim: Claim | None,
        idempotency: Idempotency | None,
    ) -> None:
        self.run = run
        self.prepared = prepared
        self._db = db
        self._claim = claim
        self._idempotency = idempotency
        self._log_events = claim is not None and prepared.request.stream
        self.saved = False  # the final write committed
        self.store_error: LMSPError | None = None  # `store: true` and the response could not be stored

    @property
    def response_id(self) -> str:
        return self.run.response_id

    def cancel(self) -> None:
        self.run.cancel()

    async def events(self) -> AsyncIterator[Event]:
        """The run's events; the final write commits before the terminal event is yielded."""
        done = False
        try:
            async for event in self.run.events():
                if event.terminal:
                    event = await self._final_write(event)
                    done = True
                elif self._log_events and self._db is not None:
                    background(
                        self._db, event_log.append_events, self.response_id, [(event.id, event.name, event.data)]
                    )
                yield event
        finally:
            if not done:
                self._give_up()  # the client left before the end: a retry runs anew

    async def result(self) -> dict[str, Any]:
        """Run to the end (sync request); a failure raises its LMSP error after the response was stored."""
        async for _ in self.events():
            pass
        if self.store_error is not None:
            raise self.store_error
        if self.run.error is not None:
            raise self.run.error
        return self.run.assembler.response()

    async def _final_write(self, terminal: Event) -> Event:
        """Commit what the response leaves behind; the terminal event to send (a failure when a
        response the client asked to store could not be: it was told nothing is kept)."""
        db = self._db
        if db is None or not (self.prepared.store or self._claim is not None):
            return terminal
        response = self.run.assembler.response()
        stored = self.prepared.stored(response) if self.prepared.store else None
        claim = self._claim
        result: dict[str, Any] | None = None
        if claim is not None and response["status"] in KEPT_STATUSES:
            if self.prepared.request.stream:
                result = {"kind": "stream", "owner_id": self.response_id}
            else:
                result = {"kind": "response", "status": 200, "body": response}
        log_row = (terminal.id, terminal.name, terminal.data) if self._log_events else None
        try:
            await db.awrite(_finish_response, self.response_id, log_row, stored, claim, result)
            self.saved = True
        except Exception as exc:  # noqa: BLE001 - any failure: the client must not be told it is stored
            log.error("could not save response %s: %s", self.response_id, exc)
            self._give_up()
            if stored is not None:
                self.store_error = (
                    storage.lmsp_error(exc)
                    if isinstance(exc, StoreError)
                    else InternalError("The response could not be stored; it has been logged.")
                )
                terminal = _failed(terminal, self.store_error)
        self._claim = None  # finished or released: nothing left to do in `finally`
        return terminal

    def _give_up(self) -> None:
        """Release the key and close the stream's log (housekeeping expires it), without waiting."""
        if self._claim is not None and self._idempotency is not None:
            self._idempotency.release(self._claim)
            if self._log_events and self._db is not None:
                background(self._db, event_log.close_log, self.response_id)
        self._claim = None


def _finish_response(
    conn: Any, response_id: str, log_row: tuple | None, stored: Any, claim: Claim | None, result: dict[str, Any] | None
) -> None:
    """One transaction: the stream's terminal event, the stored turn, the key's result (or its release)."""
    if log_row is not None:
        try:
            event_log.append_events(conn, response_id, [log_row])
        except EventSequenceError:  # an earlier queued append failed: nothing to replay
            result = None
    if stored is not None:
        stored_responses.save(conn, stored)
    if claim is not None:
        if result is not None:
            idempotency.finish(conn, claim.scope, claim.key, result)
        else:
            idempotency.abandon(conn, claim.scope, claim.key)


def _failed(terminal: Event, error: LMSPError) -> Event:
    """`terminal` as `response.failed` with `error`, under the same id: what the client is told instead."""
    problem = error.to_problem()
    response = {**terminal.data.get("response", {}), "status": "failed", "error": problem}
    data = {
        "type": "response.failed",
        "sequence_number": terminal.id,
        "response_id": terminal.data.get("response_id"),
        "status": "failed",
        "error": problem,
        "response": response,
    }
    return Event(terminal.id, "response.failed", data)


@dataclass
class Replayed:
    """An earlier result to send again (`Idempotent-Replayed: true`)."""

    status: int
    body: dict[str, Any] | None = None
    events: list[Event] | None = None


class Responder:
    """Starts responses for `POST /responses`; without a database it is the bare service."""

    def __init__(
        self,
        service: Responses,
        *,
        db: Database | None = None,
        conversations: Conversations | None = None,
        idempotency: Idempotency | None = None,
    ) -> None:
        self.service = service
        self.db = db
        self.conversations = conversations
        self.idempotency = idempotency

    async def start(
        self, request: ResponseRequest, *, caller: Caller = ANONYMOUS, key: str | None = None
    ) -> Started | Replayed:
        """Everything that can fail before the first event; or the replay of an earlier result."""
        claim: Claim | None = None
        if key is not None and self.idempotency is not None:
            outcome = await self.idempotency.claim(caller, key, "responses", request.raw, large=request.large)
            if isinstance(outcome, Replay):
                return await self._replayed(outcome)
            claim = outcome
        try:
            if self.conversations is not None:
                prepared = await self.conversations.prepare(request, owner=caller.owner)
            else:
                prepared = PreparedRequest(request, request.input_items, caller.owner)
            try:
                run = await self.service.start_response(prepared.request)
            except LMSPError as exc:
                raise prepared.explain(exc) from None
        except BaseException:
            if claim is not None and self.idempotency is not None:
                self.idempotency.release(claim)
            raise
        if self.db is None:  # no storage: `store` is ignored, as LMSP allows
            prepared = PreparedRequest(_without_store(prepared.request), prepared.input_items, caller.owner)
        return Started(run, prepared, db=self.db, claim=claim, idempotency=self.idempotency)

    async def _replayed(self, replay: Replay) -> Replayed:
        assert self.idempotency is not None
        if replay.kind == "stream":
            return Replayed(200, events=await self.idempotency.replay_events(str(replay.result["owner_id"])))
        if replay.kind == "response":
            return Replayed(int(replay.result.get("status", 200)), body=replay.result.get("body"))
        raise IdempotencyKeyReused(
            "This Idempotency-Key was used for another kind of request; use a new key.", param="Idempotency-Key"
        )


def _without_store(request: ResponseRequest) -> ResponseRequest:
    return dataclasses.replace(request, store=False)
