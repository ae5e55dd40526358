"""The store as serving uses it: what each store failure means to a client, in one place.

Why: the store raises its own exceptions (`store.errors`), which know ids and
rows, not LMSP codes or HTTP statuses. Serving reads and writes through
`read` / `write`, which turn a store exception into the LMSP error a client
should see (`lmsp_error`); `http` then turns that into a problem document.
A call site that means something more specific catches the store exception
itself, by type, before it gets here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from lmsp_tray.errors import (
    ContextLengthExceeded,
    EventHistoryExpired,
    IdempotencyKeyInProgress,
    IdempotencyKeyReused,
    InsufficientStorage,
    InternalError,
    InvalidRequest,
    LMSPError,
    ResponseNotFound,
    TaskNotFound,
    quote,
)
from lmsp_tray.store import Database
from lmsp_tray.store.errors import (
    ChainBroken,
    ChainTooLong,
    EventsExpired,
    KeyInProgress,
    KeyReused,
    ResponseMissing,
    StorageFull,
    StoreClosed,
    StoreError,
    TaskMissing,
    UnknownCursor,
    UnknownStatus,
)
from lmsp_tray.store.task_rows import TASK_STATUSES

log = logging.getLogger("lmsp_tray.serving.storage")

T = TypeVar("T")


def lmsp_error(exc: StoreError) -> LMSPError:
    """The LMSP error a client sees for a store failure (one nobody handled more specifically)."""
    if isinstance(exc, KeyReused):
        return IdempotencyKeyReused(
            "This Idempotency-Key was already used with a different request body; use a new key.",
            param="Idempotency-Key",
        )
    if isinstance(exc, KeyInProgress):
        return IdempotencyKeyInProgress(
            "A request with this Idempotency-Key is still running; retry after it finishes.", param="Idempotency-Key"
        )
    if isinstance(exc, ResponseMissing):
        return ResponseNotFound(
            f"No stored response {quote(exc.response_id)} to continue from: previous_response_id must name a response "
            f'created with "store": true that has not been deleted.',
            param="previous_response_id",
        )
    if isinstance(exc, ChainBroken):
        reason = (
            f"continues {exc.missing}, which is no longer stored"
            if exc.missing
            else "continues a response of another token"
        )
        return ResponseNotFound(
            f"The conversation ending with {quote(exc.response_id)} {reason}.", param="previous_response_id"
        )
    if isinstance(exc, ChainTooLong):
        return ContextLengthExceeded(
            f"The conversation ending with {quote(exc.response_id)} is longer than {exc.max_turns} turns; "
            "continue from an earlier response or start a new conversation.",
            param="previous_response_id",
        )
    if isinstance(exc, EventsExpired):
        return EventHistoryExpired(
            f"The events of {exc.owner_id} are past the retention period; read the result from the task instead."
        )
    if isinstance(exc, TaskMissing):
        return TaskNotFound(f"No task {quote(exc.task_id)}. GET /lmsp/v1/tasks lists the tasks that are kept.")
    if isinstance(exc, UnknownCursor):
        return TaskNotFound(
            f"No task {quote(exc.task_id)} to continue the list after; start again without 'after'.", param="after"
        )
    if isinstance(exc, UnknownStatus):
        return InvalidRequest(
            f"Unknown task status {quote(exc.status)}; use one of {', '.join(TASK_STATUSES)}.", param="status"
        )
    if isinstance(exc, StoreClosed):
        return InternalError("The service's database is closed: the service is stopping.")
    if isinstance(exc, StorageFull):
        return disk_full()
    log.error("store failure: %s", exc, exc_info=exc)
    return InternalError("The service could not read or write its database; it has been logged.")


def disk_full() -> InsufficientStorage:
    """The 507 for a write the full disk refused: nothing of it was kept."""
    return InsufficientStorage(
        "The disk holding the service's data is full, so nothing of this request was stored. Free some disk "
        "space and retry."
    )


async def read(db: Database, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`db.aread`, with a store failure raised as its LMSP error."""
    try:
        return await db.aread(fn, *args, **kwargs)
    except StoreError as exc:
        raise lmsp_error(exc) from exc


async def write(db: Database, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`db.awrite`, with a store failure raised as its LMSP error."""
    try:
        return await db.awrite(fn, *args, **kwargs)
    except StoreError as exc:
        raise lmsp_error(exc) from exc
