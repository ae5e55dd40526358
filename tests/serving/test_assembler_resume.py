"""`ResponseAssembler.resume`: a response cut short (a task's log after a crash) is ended by the same code as a
live one, and `recovery.end_task` writes exactly those events."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lmsp_tray.errors import ServiceRestarted
from lmsp_tray.protocol.events import Event, ResponseAssembler
from lmsp_tray.serving.recovery import end_task
from lmsp_tray.store import Database, event_log
from lmsp_tray.store import task_rows as tasks

PROBLEM = ServiceRestarted("The service stopped.").to_problem()

# What a model may produce: reasoning, then text, then two function calls.
STEPS: list[Callable[[ResponseAssembler], list[Event]]] = [
    lambda a: a.start(),
    lambda a: a.reasoning("Let me "),
    lambda a: a.reasoning("think."),
    lambda a: a.text("Hello"),
    lambda a: a.text(", world"),
    lambda a: a.function_call_start("lookup"),
    lambda a: a.function_call_arguments('{"q": '),
    lambda a: a.function_call_arguments('"tide"}'),
    lambda a: a.function_call_start("other"),
    lambda a: a.close_item(),
    lambda a: a.text("after the calls"),
]


@pytest.mark.parametrize("cut", range(1, len(STEPS) + 1))
@pytest.mark.parametrize("end", ["fail", "cancel"])
def test_a_resumed_response_ends_exactly_like_the_live_one(cut: int, end: str) -> None:
    live = ResponseAssembler("m", response_id="resp_1", created_at=7)
    logged: list[Event] = []
    for step in STEPS[:cut]:
        logged += step(live)

    resumed = ResponseAssembler.resume(logged, "other-model", response_id="resp_other", created_at=1)
    assert resumed.started and resumed.response() == live.response()

    def finish(a: ResponseAssembler) -> list[Event]:
        return a.close_item("incomplete") + (a.fail(PROBLEM) if end == "fail" else a.cancel())

    expected = finish(live)
    assert finish(resumed) == expected
    assert resumed.response() == live.response()
    assert [e.id for e in logged + expected] == list(range(1, len(logged) + len(expected) + 1))


def test_resume_without_events_uses_what_the_task_knows() -> None:
    resumed = ResponseAssembler.resume([], "m", response_id="resp_9", created_at=5)
    assert not resumed.started
    created = resumed.start()
    assert [e.id for e in created] == [1] and created[0].data["response"]["id"] == "resp_9"
    assert created[0].data["response"]["created_at"] == 5 and created[0].data["response"]["model"] == "m"


def test_a_finished_response_cannot_be_resumed() -> None:
    live = ResponseAssembler("m")
    events = live.start() + live.text("x") + live.complete(1, 1)
    with pytest.raises(ValueError):
        ResponseAssembler.resume(events, "m")


def test_end_task_writes_the_assemblers_events(tmp_path: Path) -> None:
    """A task cut mid-message: the open item is closed `incomplete` with its text, then `response.failed`."""
    live = ResponseAssembler("m", response_id="resp_t", created_at=3)
    logged = live.start() + live.text("The sea ") + live.text("was calm")
    with Database(tmp_path / "store.sqlite3") as db:
        db.write_sync(tasks.create, "task_cut", {"model": "m", "input": "x"}, response_id="resp_t", now=3.0)
        db.write_sync(tasks.mark_in_progress, "task_cut")
        db.write_sync(event_log.append_events, "task_cut", [(e.id, e.name, e.data) for e in logged])
        written = db.write_sync(end_task, "task_cut", "failed", PROBLEM)
        assert written is not None
        assert [e.name for e in written] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.failed",
        ]
        assert written[2].data["item"]["status"] == "incomplete"
        final = written[-1].data["response"]
        assert final["status"] == "failed" and final["error"] == PROBLEM
        assert final["output"][0]["content"][0]["text"] == "The sea was calm"
        stored = db.read(event_log.read_events, "task_cut")
        assert [(e.seq, e.event) for e in stored] == [(e.id, e.name) for e in logged + written]
        task = db.read(tasks.get, "task_cut")
        assert task.status == "failed" and task.response == final
        assert db.write_sync(end_task, "task_cut", "failed", PROBLEM) is None  # ended once only

        # A queued task that never ran: a well-formed stream from id 1.
        db.write_sync(tasks.create, "task_q", {"model": "m", "input": "x"}, response_id="resp_q", now=4.0)
        written = db.write_sync(end_task, "task_q", "cancelled")
        assert [(e.id, e.name) for e in written] == [(1, "response.created"), (2, "response.cancelled")]
        assert written[-1].data["response"]["id"] == "resp_q"
