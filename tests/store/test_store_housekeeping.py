"""Housekeeping on a real SQLite file: what expires, what stays, in small steps, file kept bounded."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lmsp_tray.store import (
    Database,
    EventsExpired,
    Housekeeper,
    StoredResponse,
    TokenRecord,
    purge,
)
from lmsp_tray.store import access_tokens as tokens
from lmsp_tray.store import event_log as events
from lmsp_tray.store import idempotency_keys as idempotency
from lmsp_tray.store import stored_responses as responses
from lmsp_tray.store import task_rows as tasks
from lmsp_tray.store.housekeeping import _expire_logs

DAY = 86400.0
PAD = "x" * 600  # makes events big enough to free whole pages


@pytest.fixture
def db(tmp_path: Path):
    database = Database(tmp_path / "store.sqlite3")
    yield database
    database.close()


def finished_task(db: Database, tid: str, n_events: int, at: float) -> None:
    db.write_sync(tasks.create, tid, {"model": "m"}, now=at)
    db.write_sync(tasks.mark_in_progress, tid, now=at)
    evs = [(seq, "response.output_text.delta", {"seq": seq, "pad": PAD}) for seq in range(1, n_events)]
    evs.append((n_events, "response.completed", {"seq": n_events}))
    db.write_sync(
        tasks.finish, tid, "completed", response={"id": "resp_" + tid, "status": "completed"}, events=evs, now=at
    )


def count(db: Database, table: str) -> int:
    return db.read(lambda c: c.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_purge_expires_old_events_but_keeps_task_results(db: Database) -> None:
    t0 = 1_000_000.0
    finished_task(db, "task_old", 40, t0)
    finished_task(db, "task_recent", 5, t0 + DAY)
    db.write_sync(tasks.create, "task_running", {}, now=t0)
    db.write_sync(tasks.mark_in_progress, "task_running", now=t0)
    db.write_sync(events.append_events, "task_running", [(1, "response.created", {})], now=t0)
    db.write_sync(
        events.append_events, "resp_stream", [(1, "response.created", {}), (2, "response.completed", {})], now=t0
    )

    report = purge(db, now=t0 + DAY + 1, event_retention_s=DAY, idempotency_ttl_s=2 * DAY, batch_size=7)

    assert report.logs_expired == 1 and report.events == 40
    assert report.steps > 40 // 7  # small batches, each its own transaction
    with pytest.raises(EventsExpired):
        db.read(events.read_events, "task_old", 0)
    assert db.read(events.last_event_seq, "task_old") == 40
    old = db.read(tasks.get, "task_old")
    assert old.status == "completed" and old.response["id"] == "resp_task_old"
    assert [e.seq for e in db.read(events.read_events, "task_recent")] == [1, 2, 3, 4, 5]
    assert [e.seq for e in db.read(events.read_events, "task_running")] == [1]  # running: never expires
    assert len(db.read(events.read_events, "resp_stream")) == 2  # replay logs live as long as keys
    assert count(db, "events") == 5 + 1 + 2

    report = purge(db, now=t0 + 2 * DAY + 2, event_retention_s=DAY, idempotency_ttl_s=2 * DAY)
    assert report.events == 5 + 2
    assert db.read(events.get_log, "resp_stream") is None  # a direct stream's log goes entirely
    assert db.read(events.get_log, "task_recent").expired
    assert count(db, "events") == 1
    assert purge(db, now=t0 + 2 * DAY + 2, event_retention_s=DAY).events == 0  # nothing left to do


def test_a_log_is_expired_before_its_events_go(db: Database) -> None:
    """Between the steps of a purge a reader sees 410, never a log missing its first events."""
    finished_task(db, "task_a", 10, 0.0)
    assert db.write_sync(_expire_logs, 100.0, 50.0, 50.0, 10) == 1
    assert count(db, "events") == 10  # not deleted yet
    with pytest.raises(EventsExpired):
        db.read(events.read_events, "task_a", 3)


def test_purge_idempotency_keys_responses_and_old_tasks(db: Database) -> None:
    t0 = 5_000_000.0
    db.write_sync(idempotency.begin, "tok", "old", "h", now=t0)
    db.write_sync(idempotency.begin, "tok", "new", "h", now=t0 + 2.5 * DAY)
    for i, at in enumerate((t0, t0 + 10, t0 + 3 * DAY)):
        db.write_sync(responses.save, StoredResponse(f"resp_{i}", "m", at, "completed", [], {"output": []}))
    finished_task(db, "task_ancient", 3, t0)
    finished_task(db, "task_young", 3, t0 + 3 * DAY)
    db.write_sync(tasks.create, "task_queued", {}, now=t0)

    kept_everything = purge(db, now=t0 + 3 * DAY + 1, event_retention_s=DAY, idempotency_ttl_s=DAY)
    assert kept_everything.idempotency_keys == 1 and kept_everything.responses == 0
    assert db.read(idempotency.get, "tok", "old") is None and db.read(idempotency.get, "tok", "new") is not None
    assert count(db, "responses") == 3 and count(db, "tasks") == 3  # no TTL given: kept

    report = purge(
        db,
        now=t0 + 3 * DAY + 1,
        event_retention_s=DAY,
        idempotency_ttl_s=DAY,
        response_ttl_s=2 * DAY,
        task_ttl_s=2 * DAY,
    )
    assert report.responses == 2 and report.tasks == 1
    assert db.read(responses.get, "resp_2") is not None
    assert db.read(tasks.get, "task_ancient") is None and db.read(events.get_log, "task_ancient") is None
    assert db.read(tasks.get, "task_young") is not None and len(db.read(events.read_events, "task_young")) == 3
    assert db.read(tasks.get, "task_queued").status == "queued"  # unfinished tasks are never purged


def test_task_ttl_shorter_than_event_retention(db: Database) -> None:
    finished_task(db, "task_a", 4, 0.0)
    report = purge(db, now=100.0, event_retention_s=DAY, task_ttl_s=50.0)
    assert report.events == 4 and report.tasks == 1
    assert count(db, "tasks") == 0 and count(db, "event_logs") == 0 and count(db, "events") == 0


def test_purge_gives_pages_back(tmp_path: Path) -> None:
    with Database(tmp_path / "store.sqlite3") as db:
        for i in range(20):
            finished_task(db, f"task_{i:02d}", 50, 0.0)
        pages = lambda: db.read(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        full = pages()
        report = purge(db, now=10 * DAY, event_retention_s=DAY)
        assert report.events == 1000 and report.pages_freed > 0
        assert pages() < full // 2
        assert db.integrity_check() == "ok"


def test_purge_while_writing_keeps_writes_flowing(db: Database) -> None:
    """Purge steps interleave with other writes: appends submitted meanwhile all commit, in order."""
    for i in range(10):
        finished_task(db, f"task_{i}", 100, 0.0)
    stop = threading.Event()
    appended: list[int] = []

    def writer() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            appended.append(db.write_sync(events.append_events, "task_live", [(seq, "delta", {"n": seq})]))

    th = threading.Thread(target=writer)
    th.start()
    try:
        report = purge(db, now=10 * DAY, event_retention_s=DAY, batch_size=20)
    finally:
        stop.set()
        th.join(30)
    assert report.events == 1000
    assert appended == list(range(1, len(appended) + 1))
    assert [e.seq for e in db.read(events.read_events, "task_live")] == appended


def test_housekeeper_thread_purges_and_flushes_last_used(db: Database) -> None:
    finished_task(db, "task_a", 3, 0.0)
    db.write_sync(tokens.insert, TokenRecord("tok_1", "laptop", ("models:read",), 0.0, "f" * 64))
    batcher = tokens.LastUsedBatcher()
    keeper = Housekeeper(
        db, event_retention_s=60.0, interval_s=3600.0, flush_interval_s=0.05, last_used=batcher, clock=lambda: 1000.0
    )
    keeper.start()
    try:
        batcher.note("tok_1", 123.0)
        waited = threading.Event()
        for _ in range(600):  # poll for the background effects (bounded; not a timing assertion)
            if keeper.purges and db.read(tokens.get, "tok_1").last_used_at == 123.0:
                break
            waited.wait(0.05)
        assert keeper.purges >= 1 and keeper.last_report.events == 3
        assert db.read(tokens.get, "tok_1").last_used_at == 123.0
        batcher.note("tok_1", 456.0)
    finally:
        keeper.stop()
    assert db.read(tokens.get, "tok_1").last_used_at == 456.0  # stop() writes what is pending
    assert keeper.errors == 0
    with pytest.raises(RuntimeError):
        keeper.start().start()
    keeper.stop()
