"""What the store raises: its own exceptions, which know nothing of HTTP or LMSP codes.

Why a module of its own: every repository module raises these, `database`
and `migrations` both need `SchemaTooNew` (so neither imports the other for
it), and the layers above decide what a failure means to a client —
`serving` maps them to LMSP errors (`serving.store_errors`), `http` maps
those to problem documents. Each exception carries the ids it is about as
attributes, so no caller has to read its message.
"""

from __future__ import annotations

import errno
from pathlib import Path


class StoreError(Exception):
    """The database could not do what was asked."""


# -- the database file ------------------------------------------------------------------------------
class SchemaTooNew(StoreError):
    """The database was written by a newer lmsp-tray; this version must not touch it."""

    def __init__(self, path: Path, found: int, known: int) -> None:
        super().__init__(
            f"the database {path} has schema version {found}, but this lmsp-tray only knows "
            f"versions up to {known}; upgrade lmsp-tray or move the file away"
        )
        self.path, self.found, self.known = path, found, known


class NotOurDatabase(StoreError):
    """The file is not an SQLite database, or belongs to another application."""


class StorageFull(StoreError, OSError):
    """The disk (or quota) holding the database is full: nothing of the write was kept.

    Also an `OSError` with `errno.ENOSPC`, so a layer that knows nothing of the store treats it as it
    treats any other full disk."""

    def __init__(self, path: Path) -> None:
        OSError.__init__(self, errno.ENOSPC, f"the disk holding {path} is full", str(path))
        self.path = path

    def __str__(self) -> str:
        return f"the disk holding {self.path} is full"


class StoreClosed(StoreError):
    """A read or write was submitted after `Database.close()`."""


# -- event logs -------------------------------------------------------------------------------------
class EventSequenceError(StoreError):
    """An append that would break the log: a gap, an event after the terminal one, an expired log."""


class DuplicateEvent(EventSequenceError):
    """An append with an event id the log already holds."""


class EventsExpired(StoreError):
    """The log is past its retention and the reader still lacks some of its events."""

    def __init__(self, owner_id: str) -> None:
        super().__init__(f"the events of {owner_id} are past the retention period")
        self.owner_id = owner_id


# -- idempotency keys -------------------------------------------------------------------------------
class KeyReused(StoreError):
    """The key was used before with a different request body."""

    def __init__(self, key: str) -> None:
        super().__init__(f"idempotency key {key!r} was already used with a different request body")
        self.key = key


class KeyInProgress(StoreError):
    """The request that claimed the key (with this body) is still running."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the request with idempotency key {key!r} is still running")
        self.key = key


# -- stored responses -------------------------------------------------------------------------------
class ResponseMissing(StoreError):
    """No stored response with this id (for this owner)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(f"no stored response {response_id}")
        self.response_id = response_id


class ChainBroken(StoreError):
    """A conversation's earlier link is gone (`missing`) or belongs to another owner (`missing` is None)."""

    def __init__(self, response_id: str, missing: str | None) -> None:
        reason = f"continues {missing}, which is no longer stored" if missing else "continues another owner's response"
        super().__init__(f"the conversation ending with {response_id} {reason}")
        self.response_id, self.missing = response_id, missing


class ChainTooLong(StoreError):
    """The conversation has more turns than a chain may hold."""

    def __init__(self, response_id: str, max_turns: int) -> None:
        super().__init__(f"the conversation ending with {response_id} is longer than {max_turns} turns")
        self.response_id, self.max_turns = response_id, max_turns


class ChainCycle(StoreError):
    """The links of a conversation lead back to one of its own turns (a corrupt database)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(f"the conversation ending with {response_id} links back to itself")
        self.response_id = response_id


# -- tasks ------------------------------------------------------------------------------------------
class TaskMissing(StoreError):
    """No task with this id."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id}")
        self.task_id = task_id


class UnknownStatus(StoreError):
    """A task status the store does not know."""

    def __init__(self, status: str) -> None:
        super().__init__(f"unknown task status {status!r}")
        self.status = status


class UnknownCursor(StoreError):
    """`after` names a task that is not there to continue a list from."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id} to continue the list after")
        self.task_id = task_id
