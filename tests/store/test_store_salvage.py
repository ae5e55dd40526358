"""A damaged database is set aside under a dated name and the store starts fresh (issue 15 D).

Each kind of damage is made on a real database file: a garbage header, random pages written over
it, a truncated file, a folder in its place, another application's SQLite file. The moved file
keeps every byte; a database from a newer lmsp-tray is refused and left untouched."""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from lmsp_tray.store import SchemaTooNew, stored_responses
from lmsp_tray.store.database import Database
from lmsp_tray.store.migrations import MIGRATIONS
from lmsp_tray.store.salvage import open_store

NOW = 1796120000.0  # a fixed clock: the dated name is predictable


def real_database(path: Path) -> None:
    """A database of this version holding a few stored responses (several pages of them)."""
    with Database(path) as db:
        for i in range(60):
            db.write_sync(
                stored_responses.save,
                stored_responses.StoredResponse(
                    id=f"resp_{i:026d}",
                    created_at=1,
                    model="m",
                    status="completed",
                    input_items=[{"type": "message", "role": "user", "content": "x" * 2000}],
                    response={"id": f"resp_{i:026d}", "output": []},
                ),
            )


def garbage_header(path: Path) -> None:
    real_database(path)
    with open(path, "r+b") as f:
        f.write(b"not sqlite at all, just noise" * 3)


def random_pages(path: Path) -> None:
    real_database(path)
    rng = random.Random(15)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        for page in (2, 3, size // 4096 // 2):
            f.seek(page * 4096)
            f.write(bytes(rng.getrandbits(8) for _ in range(4096)))


def truncated(path: Path) -> None:
    real_database(path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3)


def folder(path: Path) -> None:
    path.mkdir()
    (path / "something.txt").write_text("a person's file")


def foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE contacts (name)")
    conn.execute("INSERT INTO contacts VALUES ('Ada')")
    conn.commit()
    conn.close()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbage header": garbage_header,
    "random pages": random_pages,
    "truncated": truncated,
    "a folder in its place": folder,
    "another application's database": foreign,
}


def snapshot(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.iterdir()}
    return {"": path.read_bytes()}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_set_aside_and_a_new_store_opens(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "lmsp-tray.sqlite3"
    DAMAGE[kind](path)
    before = snapshot(path)
    db, aside = open_store(path, now=NOW)
    try:
        assert aside is not None, "the damage was not noticed"
        assert aside.moved_to.name.startswith("lmsp-tray.damaged-") and aside.moved_to.suffix == ".sqlite3"
        assert snapshot(aside.moved_to) == before  # every byte kept
        message = aside.message()
        assert str(path) in message and str(aside.moved_to) in message and "not deleted" in message
        assert db.integrity_check() == "ok"  # a new, working store in the old place
        assert db.read(lambda c: c.execute("SELECT count(*) FROM responses").fetchone()[0]) == 0
    finally:
        db.close()


def test_a_sound_database_is_opened_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "lmsp-tray.sqlite3"
    real_database(path)
    db, aside = open_store(path, now=NOW)
    try:
        assert aside is None
        assert db.read(lambda c: c.execute("SELECT count(*) FROM responses").fetchone()[0]) == 60
    finally:
        db.close()
    assert [p.name for p in tmp_path.iterdir() if "damaged" in p.name] == []


def test_set_aside_twice_in_one_second_keeps_both(tmp_path: Path) -> None:
    path = tmp_path / "lmsp-tray.sqlite3"
    moved = []
    for _ in range(2):
        garbage_header(path)
        db, aside = open_store(path, now=NOW)
        db.close()
        assert aside is not None
        moved.append(aside.moved_to)
    assert moved[0] != moved[1] and all(m.exists() for m in moved)


def test_the_wal_goes_with_its_database(tmp_path: Path) -> None:
    path = tmp_path / "lmsp-tray.sqlite3"
    garbage_header(path)
    wal = path.with_name(path.name + "-wal")
    wal.write_bytes(b"frames of a damaged file")
    db, aside = open_store(path, now=NOW)
    db.close()
    assert aside is not None
    assert aside.moved_to.with_name(aside.moved_to.name + "-wal").read_bytes() == b"frames of a damaged file"


def test_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "lmsp-tray.sqlite3"
    real_database(path)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(SchemaTooNew) as info:
        open_store(path, now=NOW)
    assert info.value.found == len(MIGRATIONS) + 1 and "upgrade lmsp-tray" in str(info.value)
    assert path.read_bytes() == before and not [p for p in tmp_path.iterdir() if "damaged" in p.name]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may open any file")
def test_a_file_this_user_may_not_open_is_no_damage(tmp_path: Path) -> None:
    path = tmp_path / "lmsp-tray.sqlite3"
    real_database(path)
    path.chmod(0)
    with pytest.raises(sqlite3.Error):
        open_store(path, now=NOW)
    assert path.exists()
