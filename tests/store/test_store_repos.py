"""The store's repositories on a real SQLite file: responses, events, tasks, idempotency, tokens."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lmsp_tray.ids import new_id
from lmsp_tray.store import (
    ChainBroken,
    ChainCycle,
    ChainTooLong,
    Database,
    DuplicateEvent,
    EventSequenceError,
    EventsExpired,
    KeyInProgress,
    KeyReused,
    ResponseMissing,
    StoredResponse,
    StoreError,
    TaskMissing,
    TokenRecord,
    UnknownCursor,
    UnknownStatus,
)
from lmsp_tray.store import access_tokens as tokens
from lmsp_tray.store import event_log as events
from lmsp_tray.store import idempotency_keys as idempotency
from lmsp_tray.store import stored_responses as responses
from lmsp_tray.store import task_rows as tasks


@pytest.fixture
def db(tmp_path: Path):
    database = Database(tmp_path / "store.sqlite3")
    yield database
    database.close()


def message(role: str, text: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def stored(rid: str, prev: str | None, question: str, answer: str, *, owner: str | None = None, at: float = 1000.0):
    response = {"id": rid, "object": "response", "status": "completed", "output": [message("assistant", answer)]}
    return StoredResponse(rid, "tiny:1m", at, "completed", [message("user", question)], response, prev, owner)


# ---- responses ---------------------------------------------------------------------------


def test_response_save_get_delete(db: Database) -> None:
    r = stored("resp_1", None, "hi", "hello", owner="tok_a")
    db.write_sync(responses.save, r)
    got = db.read(responses.get, "resp_1")
    assert got == r
    assert got.output_items == [message("assistant", "hello")]
    assert db.read(responses.get, "resp_1", owner="tok_b") is None
    assert db.read(responses.get, "resp_missing") is None
    assert db.write_sync(responses.delete, "resp_1", owner="tok_b") is False
    assert db.write_sync(responses.delete, "resp_1") is True
    assert db.write_sync(responses.delete, "resp_1") is False
    assert db.read(responses.get, "resp_1") is None


def test_response_save_replaces_same_id(db: Database) -> None:
    db.write_sync(responses.save, stored("resp_1", None, "q", "first"))
    db.write_sync(responses.save, stored("resp_1", None, "q", "second"))
    assert db.read(responses.get, "resp_1").output_items[0]["content"][0]["text"] == "second"


def test_chain_is_oldest_first_with_inputs_then_outputs(db: Database) -> None:
    db.write_sync(responses.save, stored("resp_1", None, "q1", "a1"))
    db.write_sync(responses.save, stored("resp_2", "resp_1", "q2", "a2"))
    db.write_sync(responses.save, stored("resp_3", "resp_2", "q3", "a3"))
    turns = db.read(responses.chain, "resp_3")
    assert [t.response_id for t in turns] == ["resp_1", "resp_2", "resp_3"]
    texts = [item["content"][0]["text"] for item in responses.context_items(turns)]
    assert texts == ["q1", "a1", "q2", "a2", "q3", "a3"]
    assert [t.response_id for t in db.read(responses.chain, "resp_1")] == ["resp_1"]


def test_chain_errors(db: Database) -> None:
    with pytest.raises(ResponseMissing) as info:
        db.read(responses.chain, "resp_nope")
    assert info.value.response_id == "resp_nope"
    # a deleted middle link is an error, not a shorter context
    for i in range(1, 4):
        db.write_sync(responses.save, stored(f"resp_{i}", f"resp_{i - 1}" if i > 1 else None, "q", "a"))
    db.write_sync(responses.delete, "resp_2")
    with pytest.raises(ChainBroken) as broken:
        db.read(responses.chain, "resp_3")
    assert (broken.value.response_id, broken.value.missing) == ("resp_3", "resp_2")
    # another token's response cannot be continued
    db.write_sync(responses.save, stored("resp_mine", None, "q", "a", owner="tok_a"))
    db.write_sync(responses.save, stored("resp_next", "resp_mine", "q", "a", owner="tok_b"))
    with pytest.raises(ChainBroken) as foreign:
        db.read(responses.chain, "resp_next", owner="tok_b")
    assert foreign.value.missing is None
    with pytest.raises(ResponseMissing):  # nor seen at all by another token
        db.read(responses.chain, "resp_mine", owner="tok_b")
    # a cycle is detected
    db.write_sync(responses.save, stored("resp_x", "resp_y", "q", "a"))
    db.write_sync(responses.save, stored("resp_y", "resp_x", "q", "a"))
    with pytest.raises(ChainCycle):
        db.read(responses.chain, "resp_x")


def test_chain_length_guard(db: Database) -> None:
    prev = None
    for i in range(12):
        db.write_sync(responses.save, stored(f"resp_{i:02d}", prev, "q", "a"))
        prev = f"resp_{i:02d}"
    assert len(db.read(responses.chain, prev, max_turns=12)) == 12
    with pytest.raises(ChainTooLong) as info:
        db.read(responses.chain, prev, max_turns=11)
    assert info.value.max_turns == 11


# ---- events ------------------------------------------------------------------------------


def ev(seq: int, name: str = "response.output_text.delta") -> tuple[int, str, dict]:
    return (seq, name, {"type": name, "sequence_number": seq})


def test_append_and_read_events_after(db: Database) -> None:
    assert db.write_sync(events.append_events, "task_a", [ev(1, "response.created"), ev(2), ev(3)]) == 3
    assert db.write_sync(events.append_events, "task_a", [ev(4)]) == 4
    assert [e.seq for e in db.read(events.read_events, "task_a")] == [1, 2, 3, 4]
    after2 = db.read(events.read_events, "task_a", 2)
    assert [e.seq for e in after2] == [3, 4]
    assert after2[0].data == '{"type":"response.output_text.delta","sequence_number":3}'
    assert after2[0].payload()["sequence_number"] == 3
    assert [e.seq for e in db.read(events.read_events, "task_a", 0, limit=2)] == [1, 2]
    assert db.read(events.read_events, "task_a", 4) == []
    assert db.read(events.read_events, "task_unknown") == []
    assert db.read(events.last_event_seq, "task_a") == 4
    assert db.read(events.last_event_seq, "task_unknown") == 0
    assert db.read(events.get_log, "task_a").kind == "task"
    db.write_sync(events.append_events, "resp_b", [(1, "response.created", '{"raw":true}')])
    assert db.read(events.get_log, "resp_b").kind == "response"


def test_duplicates_gaps_and_appends_after_the_end_are_refused(db: Database) -> None:
    db.write_sync(events.append_events, "task_a", [ev(1), ev(2)])
    with pytest.raises(DuplicateEvent):
        db.write_sync(events.append_events, "task_a", [ev(2)])
    with pytest.raises(DuplicateEvent):  # the whole batch is refused, nothing of it is stored
        db.write_sync(events.append_events, "task_a", [ev(3), ev(3)])
    with pytest.raises(EventSequenceError):
        db.write_sync(events.append_events, "task_a", [ev(4)])
    with pytest.raises(EventSequenceError):  # a new log starts at 1
        db.write_sync(events.append_events, "task_b", [ev(2)])
    with pytest.raises(EventSequenceError):  # terminal must be last
        db.write_sync(events.append_events, "task_a", [ev(3, "response.completed"), ev(4)])
    assert db.read(events.last_event_seq, "task_a") == 2
    db.write_sync(events.append_events, "task_a", [ev(3, "response.completed")])
    assert db.read(events.get_log, "task_a").closed
    with pytest.raises(EventSequenceError):
        db.write_sync(events.append_events, "task_a", [ev(4)])
    assert [e.seq for e in db.read(events.read_events, "task_a")] == [1, 2, 3]
    # the primary key backs the check up even for a writer that skips it
    with pytest.raises(sqlite3.IntegrityError):
        db.write_sync(
            lambda c: c.execute(
                "INSERT INTO events (owner_id, seq, event, data, created_at) VALUES ('task_a', 1, 'x', '{}', 0)"
            )
        )


def test_pipelined_appends_from_many_streams(db: Database) -> None:
    owners = [f"task_{i}" for i in range(8)]
    futures = [db.write(events.append_events, o, [ev(seq)]) for seq in range(1, 101) for o in owners]
    assert all(f.result(60) for f in futures)
    for o in owners:
        assert [e.seq for e in db.read(events.read_events, o)] == list(range(1, 101))
    assert db.stats.largest_group > 1


# ---- tasks -------------------------------------------------------------------------------


def test_task_lifecycle(db: Database) -> None:
    tid = new_id("task")
    created = db.write_sync(tasks.create, tid, {"model": "m", "input": []}, owner="tok_a", now=10.0)
    assert created.status == "queued" and created.request == {"model": "m", "input": []}
    assert db.read(tasks.get, tid) == created
    assert db.read(tasks.get, tid, owner="tok_b") is None
    running = db.write_sync(tasks.mark_in_progress, tid, response_id="resp_1", now=11.0)
    assert (running.status, running.response_id, running.started_at) == ("in_progress", "resp_1", 11.0)
    assert db.write_sync(tasks.mark_in_progress, tid, now=12.0) is None
    done = db.write_sync(
        tasks.finish,
        tid,
        "completed",
        response={"id": "resp_1", "status": "completed"},
        events=[ev(1, "response.created"), ev(2, "response.completed")],
        now=13.0,
    )
    assert (done.status, done.finished_at, done.response["id"], done.terminal) == ("completed", 13.0, "resp_1", True)
    assert db.read(events.get_log, tid).closed_at == 13.0
    # a finished task is not changed again, nor are events appended to it
    assert db.write_sync(tasks.finish, tid, "failed", error={"code": "x"}, events=[ev(3, "response.failed")]) is None
    assert db.read(tasks.get, tid).status == "completed"
    assert db.read(events.last_event_seq, tid) == 2
    with pytest.raises(TaskMissing):
        db.write_sync(tasks.finish, "task_missing", "cancelled")
    with pytest.raises(ValueError):
        db.write_sync(tasks.finish, tid, "in_progress")


def test_cancelling_a_queued_task(db: Database) -> None:
    db.write_sync(tasks.create, "task_q", {}, now=1.0)
    cancelled = db.write_sync(tasks.finish, "task_q", "cancelled", now=2.0)
    assert cancelled.status == "cancelled"
    assert db.write_sync(tasks.mark_in_progress, "task_q") is None
    assert db.read(events.get_log, "task_q").closed_at == 2.0


def test_task_list_newest_first_with_filters_and_cursor(db: Database) -> None:
    ids = [f"task_{i:02d}" for i in range(7)]
    for i, tid in enumerate(ids):
        db.write_sync(tasks.create, tid, {}, owner="tok_a" if i % 2 else "tok_b", now=100.0 + (i // 2))
    db.write_sync(tasks.finish, ids[0], "completed")
    page = db.read(tasks.list_tasks, limit=3)
    assert [t.id for t in page.items] == ["task_06", "task_05", "task_04"] and page.has_more
    page2 = db.read(tasks.list_tasks, limit=3, after=page.last_id)
    assert [t.id for t in page2.items] == ["task_03", "task_02", "task_01"] and page2.has_more
    page3 = db.read(tasks.list_tasks, limit=3, after=page2.last_id)
    assert [t.id for t in page3.items] == ["task_00"] and not page3.has_more
    assert [t.id for t in db.read(tasks.list_tasks, status="completed").items] == ["task_00"]
    assert len(db.read(tasks.list_tasks, status=["queued", "completed"]).items) == 7
    assert [t.id for t in db.read(tasks.list_tasks, owner="tok_a").items] == ["task_05", "task_03", "task_01"]
    with pytest.raises(UnknownStatus):
        db.read(tasks.list_tasks, status="done")
    with pytest.raises(UnknownCursor):
        db.read(tasks.list_tasks, after="task_nope")


def test_recover_after_crash(db: Database) -> None:
    db.write_sync(tasks.create, "task_done", {}, now=1.0)
    db.write_sync(tasks.finish, "task_done", "completed", events=[ev(1, "response.completed")])
    db.write_sync(tasks.create, "task_run", {"n": 1}, now=2.0)
    db.write_sync(tasks.mark_in_progress, "task_run", response_id="resp_r")
    db.write_sync(events.append_events, "task_run", [ev(1, "response.created"), ev(2)])
    db.write_sync(tasks.create, "task_wait2", {}, now=4.0)
    db.write_sync(tasks.create, "task_wait1", {}, now=3.0)
    db.write_sync(idempotency.begin, "tok_a", "k-running", "h1")
    db.write_sync(idempotency.begin, "tok_a", "k-done", "h2")
    db.write_sync(idempotency.finish, "tok_a", "k-done", {"kind": "task", "task_id": "task_done"})
    db.write_sync(events.append_events, "resp_direct", [ev(1, "response.created")])

    rec = db.write_sync(tasks.recover_after_crash, now=50.0)
    assert [t.id for t in rec.interrupted] == ["task_run"]
    assert [t.id for t in rec.queued] == ["task_wait1", "task_wait2"]
    assert (rec.abandoned_keys, rec.closed_streams) == (1, 1)
    assert db.read(idempotency.get, "tok_a", "k-running") is None
    assert db.read(idempotency.get, "tok_a", "k-done").state == "done"
    assert db.read(events.get_log, "resp_direct").closed_at == 50.0

    # what the service then does for the interrupted task, in one write
    def end(conn: sqlite3.Connection, task_id: str) -> object:
        seq = events.last_event_seq(conn, task_id) + 1
        error = {"code": "service_restarted"}
        return tasks.finish(conn, task_id, "failed", error=error, events=[(seq, "response.failed", {"error": error})])

    failed = db.write_sync(end, "task_run")
    assert failed.status == "failed" and failed.error == {"code": "service_restarted"}
    assert [(e.seq, e.event) for e in db.read(events.read_events, "task_run")] == [
        (1, "response.created"),
        (2, "response.output_text.delta"),
        (3, "response.failed"),
    ]
    assert db.write_sync(tasks.recover_after_crash).interrupted == []


# ---- idempotency -------------------------------------------------------------------------


def test_idempotency_begin_finish_replay_and_conflicts(db: Database) -> None:
    h = idempotency.request_hash({"model": "m", "input": [1, 2]})
    assert h == idempotency.request_hash({"input": [1, 2], "model": "m"})
    assert h != idempotency.request_hash({"model": "m", "input": [2, 1]})
    first = db.write_sync(idempotency.begin, "tok_a", "key-1", h, now=100.0)
    assert first.is_new and not first.replay and first.state == "in_progress"
    with pytest.raises(KeyInProgress) as busy:
        db.write_sync(idempotency.begin, "tok_a", "key-1", h, now=101.0)
    assert busy.value.key == "key-1"
    with pytest.raises(KeyReused) as reused:
        db.write_sync(idempotency.begin, "tok_a", "key-1", "other-hash", now=101.0)
    assert reused.value.key == "key-1"
    other_scope = db.write_sync(idempotency.begin, "tok_b", "key-1", "other-hash", now=101.0)
    assert other_scope.is_new  # keys are per token
    assert db.write_sync(idempotency.finish, "tok_a", "key-1", {"kind": "stream", "owner_id": "resp_1"}, now=102.0)
    again = db.write_sync(idempotency.begin, "tok_a", "key-1", h, now=103.0)
    assert again.replay and again.result == {"kind": "stream", "owner_id": "resp_1"} and again.finished_at == 102.0
    with pytest.raises(KeyReused):
        db.write_sync(idempotency.begin, "tok_a", "key-1", "other-hash", now=103.0)
    assert not db.write_sync(idempotency.finish, "tok_a", "key-1", {"kind": "again"})  # already done


def test_idempotency_abandon_and_expiry(db: Database) -> None:
    db.write_sync(idempotency.begin, "tok_a", "k", "h", now=0.0)
    assert db.write_sync(idempotency.abandon, "tok_a", "k")
    assert db.write_sync(idempotency.begin, "tok_a", "k", "h2", now=1.0).is_new  # free again
    db.write_sync(idempotency.finish, "tok_a", "k", {"kind": "response"}, now=2.0)
    assert not db.write_sync(idempotency.abandon, "tok_a", "k")  # a finished key stays
    assert db.write_sync(idempotency.begin, "tok_a", "k", "h2", now=1.0 + 86399).replay
    after_ttl = db.write_sync(idempotency.begin, "tok_a", "k", "h3", now=1.0 + 86400)
    assert after_ttl.is_new and after_ttl.request_hash == "h3"


# ---- tokens ------------------------------------------------------------------------------


def token(tid: str, digest: str, at: float) -> TokenRecord:
    return TokenRecord(tid, f"name {tid}", ("models:read", "responses:create"), at, digest)


def test_tokens_repo(db: Database) -> None:
    db.write_sync(tokens.insert, token("tok_1", "a" * 64, 1.0))
    db.write_sync(tokens.insert, token("tok_2", "b" * 64, 2.0))
    assert "a" * 64 not in repr(db.read(tokens.get, "tok_1"))
    assert db.read(tokens.get_by_hash, "a" * 64).id == "tok_1"
    assert db.read(tokens.get_by_hash, "c" * 64) is None
    with pytest.raises(sqlite3.IntegrityError):
        db.write_sync(tokens.insert, token("tok_3", "a" * 64, 3.0))
    db.write_sync(tokens.touch, "tok_1", now=50.0)
    db.write_sync(tokens.touch, "tok_1", now=40.0)  # never moves back
    assert db.read(tokens.get, "tok_1").last_used_at == 50.0
    assert db.write_sync(tokens.revoke, "tok_1", now=60.0)
    assert not db.write_sync(tokens.revoke, "tok_1", now=61.0)
    assert not db.write_sync(tokens.revoke, "tok_missing")
    assert db.read(tokens.get_by_hash, "a" * 64) is None
    assert db.read(tokens.get_by_hash, "a" * 64, include_revoked=True).revoked_at == 60.0
    assert [t.id for t in db.read(tokens.list_tokens)] == ["tok_1", "tok_2"]
    assert [t.id for t in db.read(tokens.list_tokens, include_revoked=False)] == ["tok_2"]
    assert db.read(tokens.get, "tok_2").scopes == ("models:read", "responses:create")
    assert db.write_sync(tokens.delete_revoked, ["tok_1", "tok_2"]) == 1
    assert [t.id for t in db.read(tokens.list_tokens)] == ["tok_2"]


def test_last_used_batcher_writes_in_one_transaction(db: Database) -> None:
    for i in range(5):
        db.write_sync(tokens.insert, token(f"tok_{i}", f"{i}" * 64, 1.0))
    batcher = tokens.LastUsedBatcher()
    for i in range(5):
        for t in (10.0, 30.0, 20.0):
            batcher.note(f"tok_{i}", t + i)
    assert batcher.pending("tok_2") == 32.0
    before = db.stats.transactions
    assert batcher.flush(db) == 5
    assert db.stats.transactions - before == 1
    assert [t.last_used_at for t in db.read(tokens.list_tokens)] == [30.0, 31.0, 32.0, 33.0, 34.0]
    assert batcher.flush(db) == 0 and batcher.pending("tok_2") is None


def test_expired_events_are_a_store_error(db: Database) -> None:
    db.write_sync(events.append_events, "task_a", [ev(1), ev(2, "response.completed")])
    db.write_sync(lambda c: c.execute("UPDATE event_logs SET expired_at = 1 WHERE owner_id = 'task_a'"))
    with pytest.raises(EventsExpired) as info:
        db.read(events.read_events, "task_a", 1)
    assert info.value.owner_id == "task_a" and isinstance(info.value, StoreError)
    assert db.read(events.read_events, "task_a", 2) == []  # nothing older was asked for
