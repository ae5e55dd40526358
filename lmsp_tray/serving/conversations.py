"""Conversations: `store: true` saves a turn, `previous_response_id` continues from one.

Why a module of its own: both ways of producing a response (`POST /responses`
and a task) must expand a `previous_response_id` into the same context and
save a finished turn the same way, and neither the service (no database in
it) nor the HTTP layer is the place for it.

The context of a continued conversation is the stored chain, oldest first —
each turn's own input items, then its output items — followed by the new
request's input; the new request's `instructions` (if any) come first, as
they would without a chain (instructions are not carried over from earlier
turns). Because every turn renders the earlier turns exactly as before, the
prompt of turn *n+1* starts with the prompt and output of turn *n*, and the
engine's slot with that prefix in its KV cache evaluates only what is new.

A stored turn keeps the input exactly as the client sent it (a string input
becomes one user message item) and the whole response object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmsp_tray.errors import ContextLengthExceeded, InputTooLong, LMSPError, ResponseNotFound, quote
from lmsp_tray.protocol.requests import Item, ResponseRequest, items_size, parse_response_create
from lmsp_tray.serving import storage
from lmsp_tray.store import Database, stored_responses
from lmsp_tray.store.stored_responses import StoredResponse


@dataclass(frozen=True)
class PreparedRequest:
    """A request with its conversation expanded, plus what to store for this turn."""

    request: ResponseRequest  # items = instructions + chain + new input
    input_items: list[dict[str, Any]]  # this turn's own input, as sent (normalised to items)
    owner: str | None = None
    chain_turns: int = 0  # stored turns before this one

    @property
    def store(self) -> bool:
        return self.request.store

    def stored(self, response: dict[str, Any]) -> StoredResponse:
        """The row to save once `response` (the final response object) is known."""
        return StoredResponse(
            id=response["id"],
            model=response["model"],
            created_at=float(response["created_at"]),
            status=response["status"],
            input_items=self.input_items,
            response=response,
            previous_response_id=self.request.previous_response_id,
            owner=self.owner,
        )

    def explain(self, error: LMSPError) -> LMSPError:
        """A context overflow caused by the stored chain names `previous_response_id` and says what to do."""
        if isinstance(error, InputTooLong) and self.chain_turns:
            prev = self.request.previous_response_id
            return ContextLengthExceeded(
                f"{error.detail.rstrip('.')}; the input includes the {self.chain_turns} stored turn(s) of the "
                f"conversation ending with {prev}. Continue from an earlier response or start a new conversation.",
                param="previous_response_id",
            )
        return error


def _history(conn: Any, previous: str, owner: str | None, model: str) -> tuple[list[Item], int, int]:
    """A read function: the stored chain ending with ``previous`` as request items, its size and turns.

    Parsed here, on the store's reader thread, so a long conversation is never
    validated on the event loop."""
    turns = stored_responses.chain(conn, previous, owner=owner)
    context = stored_responses.context_items(turns)
    if not context:
        return [], 0, len(turns)
    history = parse_response_create({"model": model, "input": context}).items
    return history, items_size(history), len(turns)


class Conversations:
    """Expands `previous_response_id` and saves, reads and deletes stored responses."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def prepare(self, request: ResponseRequest, *, owner: str | None = None) -> PreparedRequest:
        """Expand the stored chain into the request's items (404 `response_not_found` if a link is missing)."""
        own = request.input_items
        previous = request.previous_response_id
        if previous is None:
            return PreparedRequest(request, own, owner)
        history, size, turns = await storage.read(self.db, _history, previous, owner, request.model)
        lead = 1 if request.raw.get("instructions") else 0  # the instructions message parse put first
        items = request.items[:lead] + history + request.items[lead:]
        expanded = dataclasses.replace(request, items=items, size=request.size + size)
        return PreparedRequest(expanded, own, owner, turns)

    async def get(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        found = await storage.read(self.db, stored_responses.get, response_id, owner=owner)
        if found is None:
            raise ResponseNotFound(
                f'No stored response {quote(response_id)}. Only responses created with "store": true are kept.'
            )
        return found.response

    async def input_items(self, response_id: str, *, owner: str | None = None) -> list[dict[str, Any]]:
        """The stored turn's own input items, as the client sent them (a string became one message)."""
        found = await storage.read(self.db, stored_responses.get, response_id, owner=owner)
        if found is None:
            raise ResponseNotFound(
                f'No stored response {quote(response_id)}. Only responses created with "store": true are kept.'
            )
        return list(found.input_items)

    async def delete(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        if not await storage.write(self.db, stored_responses.delete, response_id, owner=owner):
            raise ResponseNotFound(f"No stored response {quote(response_id)}.")
        return {"id": response_id, "object": "response.deleted", "deleted": True}
