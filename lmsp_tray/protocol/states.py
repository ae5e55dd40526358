"""The states LMSP names on the wire: a model's and a task's.

Why a module: the manager, the service, the store, the tray and the CLI all
compare and assign them; as `StrEnum`s mypy checks every use, while the value
of each member is the very string sent in JSON bodies and kept in SQLite (a
member *is* that string: it compares, hashes and encodes as it).
"""

from __future__ import annotations

import enum


class ModelState(enum.StrEnum):
    """A model's state (PROFILE §3), as in the model object's `state`."""

    AVAILABLE = "available"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    ERROR = "error"


class TaskStatus(enum.StrEnum):
    """A task's status, as in the task object's `status` and the `tasks` table. A background
    response's task ends with its response's status."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self not in (TaskStatus.QUEUED, TaskStatus.IN_PROGRESS)
