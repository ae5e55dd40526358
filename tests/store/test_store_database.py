"""The store's Database on a real SQLite file: migrations, the single writer, readers."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from lmsp_tray.store import Database, NotOurDatabase, SchemaTooNew, StoreClosed
from lmsp_tray.store.migrations import MIGRATIONS, schema_version


def m_next_test_table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    conn.execute(
        "CREATE TABLE child (id INTEGER PRIMARY KEY, pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
    )


WITH_TEST_TABLE = (*MIGRATIONS, m_next_test_table)
NAMES = [m.__name__ for m in MIGRATIONS]
CURRENT = len(MIGRATIONS)


@pytest.fixture
def db(tmp_path: Path):
    database = Database(tmp_path / "store.sqlite3", migrations=WITH_TEST_TABLE)
    yield database
    database.close()


def put(conn: sqlite3.Connection, k: int, v: str) -> int:
    conn.execute("INSERT INTO t (k, v) VALUES (?, ?)", (k, v))
    return k


def rows(conn: sqlite3.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT k, v FROM t").fetchall())


def block_writer(db: Database) -> tuple[threading.Event, Future]:
    """Occupy the writer until the returned event is set, so later writes queue up."""
    gate, started = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> bool:
        started.set()
        return gate.wait(30)

    future = db.write(hold)
    assert started.wait(30)
    return gate, future


# ---- opening and migrations ----------------------------------------------------------------


def test_fresh_database_is_migrated_and_configured(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "store.sqlite3"
    with Database(path) as db:
        assert db.schema_version == len(MIGRATIONS)
        assert db.read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
        pragmas = db.write_sync(
            lambda c: [c.execute(f"PRAGMA {p}").fetchone()[0] for p in ("synchronous", "foreign_keys", "auto_vacuum")]
        )
        assert pragmas == [2, 1, 2]  # FULL, ON, INCREMENTAL
        tables = db.read(lambda c: {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")})
        assert {"responses", "tasks", "event_logs", "events", "idempotency", "tokens", "_migrations"} <= tables
        assert db.read(lambda c: [tuple(r) for r in c.execute("SELECT version, name FROM _migrations")]) == list(
            enumerate(NAMES, 1)
        )


def test_reopen_is_idempotent_and_upgrades_with_new_migrations(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Database(path).close()
    with Database(path) as db:  # same code: nothing to do
        assert db.schema_version == CURRENT
        assert db.read(lambda c: c.execute("SELECT count(*) FROM _migrations").fetchone()[0]) == CURRENT
    with Database(path, migrations=WITH_TEST_TABLE) as db:  # a newer release: one step more
        assert db.schema_version == CURRENT + 1
        db.write_sync(put, 1, "kept")
        assert [r[1] for r in db.read(lambda c: c.execute("SELECT version, name FROM _migrations").fetchall())] == [
            *NAMES,
            "m_next_test_table",
        ]
    with Database(path, migrations=WITH_TEST_TABLE) as db:
        assert db.read(rows) == {1: "kept"}


def test_database_from_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Database(path, migrations=WITH_TEST_TABLE) as db:
        db.write_sync(put, 7, "from the future")
    with pytest.raises(SchemaTooNew) as info:
        Database(path)
    assert (info.value.found, info.value.known) == (CURRENT + 1, CURRENT)
    assert "upgrade lmsp-tray" in str(info.value)  # what the CLI prints when it cannot start
    conn = sqlite3.connect(path)
    assert schema_version(conn) == CURRENT + 1
    assert conn.execute("SELECT v FROM t").fetchall() == [("from the future",)]
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_failed_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Database(path).close()

    def m_next_broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x)")
        raise RuntimeError("migration bug")

    with pytest.raises(RuntimeError):
        Database(path, migrations=(*MIGRATIONS, m_next_broken))
    conn = sqlite3.connect(path)
    assert schema_version(conn) == CURRENT
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchone() is None
    conn.close()


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(NotOurDatabase):
        Database(garbage)
    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("PRAGMA application_id = 1234")
    conn.execute("CREATE TABLE theirs (x)")
    conn.commit()
    conn.close()
    with pytest.raises(NotOurDatabase):
        Database(other)
    unmarked = tmp_path / "unmarked.sqlite3"  # someone else's file without an application id
    conn = sqlite3.connect(unmarked)
    conn.execute("CREATE TABLE theirs (x)")
    conn.commit()
    conn.close()
    with pytest.raises(NotOurDatabase):
        Database(unmarked)
    conn = sqlite3.connect(unmarked)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["theirs"]
    conn.close()


# ---- writing -----------------------------------------------------------------------------


def test_write_returns_after_commit_and_errors_reach_the_caller(db: Database) -> None:
    assert db.write_sync(put, 1, "a") == 1
    assert db.read(rows) == {1: "a"}
    with pytest.raises(sqlite3.IntegrityError):
        db.write_sync(put, 1, "duplicate")
    with pytest.raises(ZeroDivisionError):
        db.write_sync(lambda c: (put(c, 2, "rolled back"), 1 / 0))
    assert db.read(rows) == {1: "a"}


def test_queued_writes_share_one_transaction_and_fail_alone(db: Database) -> None:
    gate, holder = block_writer(db)
    before = db.stats.transactions
    seen_at_resolve: dict[int, bool] = {}

    def check_visible(k: int, fut: Future) -> None:
        if not fut.exception():
            # Runs when the future resolves: the row must already be committed.
            seen_at_resolve[k] = (
                db.read(lambda c: c.execute("SELECT 1 FROM t WHERE k = ?", (k,)).fetchone()) is not None
            )

    def maybe_fail(conn: sqlite3.Connection, k: int) -> int:
        put(conn, k, f"v{k}")
        if k % 10 == 0:
            raise ValueError(k)
        return k

    futures = {k: db.write(maybe_fail, k) for k in range(1, 101)}
    for k, fut in futures.items():
        fut.add_done_callback(lambda f, k=k: check_visible(k, f))
    gate.set()
    assert holder.result() is True
    for k, fut in futures.items():
        if k % 10 == 0:
            assert isinstance(fut.exception(30), ValueError)
        else:
            assert fut.result(30) == k
    assert db.stats.transactions - before == 2  # the holder, then the 100 queued writes as one group
    assert db.stats.largest_group == 100
    assert db.read(rows) == {k: f"v{k}" for k in range(1, 101) if k % 10}
    assert len(seen_at_resolve) == 90 and all(seen_at_resolve.values())


def test_failed_group_commit_is_retried_write_by_write(db: Database) -> None:
    gate, holder = block_writer(db)
    ok1 = db.write(put, 1, "a")
    bad = db.write(lambda c: c.execute("INSERT INTO child (id, pid) VALUES (1, 99)"))  # fails only at COMMIT
    ok2 = db.write(put, 2, "b")
    gate.set()
    holder.result()
    assert ok1.result(30) == 1 and ok2.result(30) == 2
    assert isinstance(bad.exception(30), sqlite3.IntegrityError)
    assert db.stats.group_retries == 1
    assert db.read(rows) == {1: "a", 2: "b"}
    assert db.read(lambda c: c.execute("SELECT count(*) FROM child").fetchone()[0]) == 0


def test_writes_from_one_thread_commit_in_order(db: Database) -> None:
    futures = [
        db.write(lambda c, k=k: c.execute("INSERT INTO t (v) VALUES (?)", (str(k),)).lastrowid) for k in range(300)
    ]
    ids = [f.result(30) for f in futures]
    assert ids == sorted(ids)
    assert [int(v) for _, v in sorted(db.read(rows).items())] == list(range(300))


def test_cancelled_write_never_runs(db: Database) -> None:
    gate, _holder = block_writer(db)
    cancelled = db.write(put, 1, "never")
    kept = db.write(put, 2, "yes")
    assert cancelled.cancel()
    gate.set()
    assert kept.result(30) == 2
    assert db.read(rows) == {2: "yes"}


def test_write_sync_inside_a_write_is_refused(db: Database) -> None:
    with pytest.raises(RuntimeError):
        db.write_sync(lambda c: db.write_sync(put, 1, "deadlock"))


def test_close_drains_queued_writes_then_refuses_more(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    db = Database(path, migrations=WITH_TEST_TABLE)
    gate, _holder = block_writer(db)
    futures = [db.write(put, k, "queued") for k in range(50)]
    closer = threading.Thread(target=db.close)
    closer.start()
    gate.set()
    closer.join(30)
    assert not closer.is_alive()
    assert [f.result(0) for f in futures] == list(range(50))
    with pytest.raises(StoreClosed):
        db.write(put, 99, "late")
    with Database(path, migrations=WITH_TEST_TABLE) as again:
        assert len(again.read(rows)) == 50
    assert not Path(str(path) + "-wal").exists() or Path(str(path) + "-wal").stat().st_size == 0


# ---- reading -----------------------------------------------------------------------------


def test_readers_are_read_only(db: Database) -> None:
    with pytest.raises(sqlite3.OperationalError):
        db.read(put, 1, "no")


def test_nested_reads_share_a_snapshot_and_reads_after_close_fail(tmp_path: Path) -> None:
    db = Database(tmp_path / "store.sqlite3", migrations=WITH_TEST_TABLE)
    db.write_sync(put, 1, "a")
    assert db.read(lambda c: db.read(rows)) == {1: "a"}
    db.close()
    with pytest.raises(StoreClosed):
        db.read(rows)
    with pytest.raises(StoreClosed):
        asyncio.run(db.aread(rows))
    db.close()  # closing twice is harmless


def test_writer_survives_a_write_function_that_raises_baseexception(db: Database) -> None:
    class Stop(BaseException):
        pass

    def bad(conn: sqlite3.Connection) -> None:
        put(conn, 1, "half")
        raise Stop()

    with pytest.raises(Stop):
        db.write_sync(bad)
    assert db.write_sync(put, 2, "after") == 2
    assert db.read(rows) == {2: "after"}


def test_concurrent_readers_see_consistent_snapshots_while_writing(db: Database) -> None:
    """Writers keep two tables in step; readers in other threads must never see them apart."""

    def step(conn: sqlite3.Connection, k: int) -> None:
        put(conn, k, "x")
        conn.execute("INSERT INTO parent (id) VALUES (?)", (k,))

    def snapshot(conn: sqlite3.Connection) -> tuple[int, int]:
        a = conn.execute("SELECT count(*) FROM t").fetchone()[0]
        b = conn.execute("SELECT count(*) FROM parent").fetchone()[0]
        return a, b

    stop = threading.Event()
    problems: list[str] = []
    reads = [0] * 4

    def reader(i: int) -> None:
        last = 0
        while not stop.is_set():
            a, b = db.read(snapshot)
            if a != b or a < last:
                problems.append(f"reader {i}: saw {a} vs {b} after {last}")
            last = a
            reads[i] += 1

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    try:
        pending = [db.write(step, k) for k in range(1, 1001)]
        for f in pending:
            f.result(60)
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert problems == []
    assert all(n > 0 for n in reads)
    assert db.read(snapshot) == (1000, 1000)
    assert db.integrity_check() == "ok"


# ---- asyncio -----------------------------------------------------------------------------


def test_async_wrappers_do_not_block_the_event_loop(db: Database) -> None:
    async def scenario() -> tuple[bool, int, dict[int, str]]:
        gate = threading.Event()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(5):
                ticks += 1
                await asyncio.sleep(0)
            gate.set()  # only reachable if the loop keeps running while the write waits

        waiter = asyncio.ensure_future(db.awrite(lambda c: (put(c, 1, "async"), gate.wait(30))[1]))
        await ticker()
        opened = await waiter
        return opened, ticks, await db.aread(rows)

    opened, ticks, seen = asyncio.run(scenario())
    assert opened is True and ticks == 5
    assert seen == {1: "async"}


def test_async_errors_are_raised_in_the_coroutine(db: Database) -> None:
    async def scenario() -> None:
        await db.awrite(put, 1, "a")
        await db.awrite(put, 1, "again")

    with pytest.raises(sqlite3.IntegrityError):
        asyncio.run(scenario())
