"""Persistence: one SQLite database (WAL) behind a single writer thread.

`Database` owns the file (migrations, the writer, read-only readers). The
repository modules — `responses`, `tasks`, `events`, `idempotency`,
`tokens` — are plain functions taking a connection, so a caller composes
several of them into one atomic write::

    await db.awrite(responses.save, stored)
    turns = await db.aread(responses.chain, previous_id)
    await db.awrite(events.append_events, task_id, [(seq, name, data)])

`housekeeping` purges what is past its time in the background.
"""

from lmsp_tray.store.database import (
    Database,
    NotOurDatabase,
    SchemaTooNew,
    StoreClosed,
    StoreError,
    WriterStats,
)
from lmsp_tray.store.events import DuplicateEvent, EventSequenceError, StoredEvent
from lmsp_tray.store.housekeeping import Housekeeper, PurgeReport, purge
from lmsp_tray.store.idempotency import IdempotencyRecord
from lmsp_tray.store.responses import StoredResponse, Turn
from lmsp_tray.store.tasks import Recovery, TaskPage, TaskRecord
from lmsp_tray.store.tokens import LastUsedBatcher, TokenRecord

__all__ = [
    "Database",
    "DuplicateEvent",
    "EventSequenceError",
    "Housekeeper",
    "IdempotencyRecord",
    "LastUsedBatcher",
    "NotOurDatabase",
    "PurgeReport",
    "Recovery",
    "SchemaTooNew",
    "StoreClosed",
    "StoreError",
    "StoredEvent",
    "StoredResponse",
    "TaskPage",
    "TaskRecord",
    "TokenRecord",
    "Turn",
    "WriterStats",
    "purge",
]
