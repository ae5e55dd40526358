"""Persistence: one SQLite database (WAL) behind a single writer thread.

`Database` owns the file (migrations, the writer, read-only readers). The
repository modules — `stored_responses`, `task_rows`, `event_log`,
`idempotency_keys`, `access_tokens` — are plain functions taking a connection,
so a caller composes several of them into one atomic write::

    await db.awrite(stored_responses.save, stored)
    turns = await db.aread(stored_responses.chain, previous_id)
    await db.awrite(event_log.append_events, task_id, [(seq, name, data)])

`housekeeping` purges what is past its time in the background. Failures are
the store's own exceptions (`errors`), never HTTP or LMSP errors: `serving`
decides what each means to a client.
"""

from lmsp_tray.store.access_tokens import LastUsedBatcher, TokenRecord
from lmsp_tray.store.database import Database, WriterStats
from lmsp_tray.store.errors import (
    ChainBroken,
    ChainCycle,
    ChainTooLong,
    DuplicateEvent,
    EventSequenceError,
    EventsExpired,
    KeyInProgress,
    KeyReused,
    NotOurDatabase,
    ResponseMissing,
    SchemaTooNew,
    StoreClosed,
    StoreError,
    TaskMissing,
    UnknownCursor,
    UnknownStatus,
)
from lmsp_tray.store.event_log import StoredEvent
from lmsp_tray.store.housekeeping import Housekeeper, PurgeReport, purge
from lmsp_tray.store.idempotency_keys import IdempotencyRecord
from lmsp_tray.store.stored_responses import StoredResponse, Turn
from lmsp_tray.store.task_rows import Recovery, TaskPage, TaskRecord

__all__ = [
    "ChainBroken",
    "ChainCycle",
    "ChainTooLong",
    "Database",
    "DuplicateEvent",
    "EventSequenceError",
    "EventsExpired",
    "Housekeeper",
    "IdempotencyRecord",
    "KeyInProgress",
    "KeyReused",
    "LastUsedBatcher",
    "NotOurDatabase",
    "PurgeReport",
    "Recovery",
    "ResponseMissing",
    "SchemaTooNew",
    "StoreClosed",
    "StoreError",
    "StoredEvent",
    "StoredResponse",
    "TaskMissing",
    "TaskPage",
    "TaskRecord",
    "TokenRecord",
    "Turn",
    "UnknownCursor",
    "UnknownStatus",
    "WriterStats",
    "purge",
]
