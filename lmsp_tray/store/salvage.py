"""A damaged database is set aside under a dated name, never deleted, and the service starts fresh.

Why: the service can run without its store's past (stored responses, tasks, app tokens), but not
without a store. A file that is not a database (garbage, truncated, random pages over it), a folder
where the file should be, or another application's SQLite file would otherwise stop every start
with the same error. `open_store` moves such a file (with its `-wal` and `-shm`) aside as
`lmsp-tray.damaged-YYYYMMDD-HHMMSS.sqlite3`, opens a new empty database, and returns what it did
(`SetAside`) for the caller to tell the person. What is *not* damage is raised as before: a
database from a newer lmsp-tray (`SchemaTooNew`: it needs that version; nothing is touched) and a
file this user may not open (a permission problem, not a broken file).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp_tray.store.database import Database
from lmsp_tray.store.errors import NotOurDatabase, SchemaTooNew

log = logging.getLogger("lmsp_tray.store.salvage")

QUICK_CHECK_MAX_BYTES = 256 * 1024 * 1024  # a larger file is not scanned at start-up (it would delay it)
COMPANIONS = ("-wal", "-shm", "-journal")
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class SetAside:
    """A damaged database moved out of the way: where it was, where it is now, and why."""

    path: Path
    moved_to: Path
    reason: str

    def message(self) -> str:
        return (
            f"The database {self.path} could not be used ({self.reason}). It was moved to {self.moved_to}, "
            "not deleted, and lmsp-tray started with a new, empty database: stored responses, tasks and the "
            "tokens of paired apps are in the moved file, so apps must pair again. Keep the moved file as a "
            "backup, or delete it once you no longer need it."
        )


def open_store(path: Path, *, now: float | None = None, **options: Any) -> tuple[Database, SetAside | None]:
    """The database at `path`, or, when that file is damaged, a new one after setting the old aside."""
    reason = _unopenable(path)  # before SQLite opens it: it could drop a -wal beside a file it cannot read
    if reason is None:
        try:
            db = Database(path, **options)
        except SchemaTooNew:
            raise
        except (NotOurDatabase, sqlite3.DatabaseError, IsADirectoryError) as exc:
            reason = _damage(path, exc)
            if reason is None:
                raise
        else:
            problem = _quick_check(db)
            if problem is None:
                return db, None
            db.close()
            reason = f"SQLite found it damaged: {problem}"
    moved = set_aside(path, now=now)
    log.warning("the database %s was damaged (%s); moved to %s, starting with a new one", path, reason, moved)
    return Database(path, **options), SetAside(path, moved, reason)


def set_aside(path: Path, *, now: float | None = None) -> Path:
    """Rename `path` (a file or a folder) and its companions to a dated name beside it; the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    stem, suffix = path.name.split(".", 1) if "." in path.name else (path.name, "")
    dot = f".{suffix}" if suffix else ""
    target = path.with_name(f"{stem}.damaged-{stamp}{dot}")
    n = 1
    while target.exists() or any(target.with_name(target.name + c).exists() for c in COMPANIONS):
        n += 1
        target = path.with_name(f"{stem}.damaged-{stamp}-{n}{dot}")
    os.rename(path, target)
    for companion in COMPANIONS:
        extra = path.with_name(path.name + companion)
        if extra.exists():
            os.rename(extra, target.with_name(target.name + companion))
    return target


def _unopenable(path: Path) -> str | None:
    """Damage visible without SQLite: a folder in the file's place, or a file that is not SQLite's."""
    if path.is_dir():
        return "a folder is where the database file should be"
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return None
    except OSError:
        return None  # unreadable: SQLite says why, and a permission problem is no damage
    if head and head != SQLITE_MAGIC:
        return "it is not an SQLite database: its first bytes are something else"
    return None


def _damage(path: Path, exc: BaseException) -> str | None:
    """Why the file at `path` is damaged, or None when `exc` is no damage (a permission problem)."""
    if path.is_dir():
        return "a folder is where the database file should be"
    if isinstance(exc, NotOurDatabase):
        return "it belongs to another application" if "another application" in str(exc) else "it is not a database"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return None
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
        return None
    return f"SQLite cannot read it: {exc}"


def _quick_check(db: Database) -> str | None:
    """SQLite's own check of every page (skipped for a very large file): None when sound."""
    try:
        if db.path.stat().st_size > QUICK_CHECK_MAX_BYTES:
            return None
        rows = db.read(lambda c: c.execute("PRAGMA quick_check(3)").fetchall())
    except sqlite3.DatabaseError as exc:
        return str(exc)
    found = [str(r[0]) for r in rows]
    return None if found == ["ok"] else "; ".join(found)
