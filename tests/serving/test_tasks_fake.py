"""The task state machine (`serving.tasks.TaskManager`) over a fake service, in milliseconds.

The service is the part faked (`serving.running.Responses`): its runs are played by the test step by step — text,
then an end — through the real `ResponseAssembler`, so what a task commits and sends is real protocol; the store is
the real SQLite database. Ollama's sched_test.go fakes its runner the same way. test_tasks_http.py and
test_task_restart.py run the same machine on real models over real HTTP.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support import until

from lmsp_tray.errors import (
    IdempotencyKeyReused,
    InputTooLong,
    InvalidRequest,
    LMSPError,
    TaskNotFound,
    TooManyRequests,
)
from lmsp_tray.protocol.events import Event, ResponseAssembler
from lmsp_tray.protocol.requests import ResponseRequest, parse_response_create
from lmsp_tray.serving import tasks as tasks_module
from lmsp_tray.serving.conversations import Conversations
from lmsp_tray.serving.replay import Caller, Idempotency
from lmsp_tray.serving.tasks import TaskManager
from lmsp_tray.store import Database, TaskRecord
from lmsp_tray.store import task_rows as task_store

TEXT = "text"
COMPLETE = "complete"


class FakeRun:
    """A response the test plays: `say(text)`, then `end()`; `crash()` makes its events raise."""

    def __init__(self, request: ResponseRequest, response_id: str | None) -> None:
        self.request = request
        self.assembler = ResponseAssembler(request.model, response_id=response_id)
        self.error: LMSPError | None = None
        self.cancelled_with: list[LMSPError | None] = []
        self._steps: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._stop = asyncio.Event()

    @property
    def response_id(self) -> str:
        return self.assembler.response_id

    def say(self, text: str) -> None:
        self._steps.put_nowait((TEXT, text))

    def end(self) -> None:
        self._steps.put_nowait((COMPLETE, None))

    def crash(self) -> None:
        self._steps.put_nowait(("crash", RuntimeError("the fake run broke")))

    def cancel(self, error: LMSPError | None = None) -> None:
        self.cancelled_with.append(error)
        self._stop.set()

    async def events(self) -> AsyncIterator[Event]:
        asm = self.assembler
        for event in asm.start():
            yield event
        while True:
            step = asyncio.ensure_future(self._steps.get())
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if self._stop.is_set():  # within one step, as the real scheduler
                step.cancel()
                error = next((e for e in self.cancelled_with if e is not None), None)
                self.error = error
                for event in asm.fail(error.to_problem()) if error else asm.cancel():
                    yield event
                return
            stop.cancel()
            kind, value = step.result()
            if kind == "crash":
                raise value
            if kind == TEXT:
                for event in asm.text(value):
                    yield event
                continue
            for event in asm.complete(3, len(asm.output_text)):
                yield event
            return


class FakeService:
    """`Responses` with scripted runs; `busy` 429s come first, `refuse` fails every start."""

    def __init__(self) -> None:
        self.runs: asyncio.Queue[FakeRun] = asyncio.Queue()
        self.started: list[FakeRun] = []
        self.attempts = 0
        self.busy = 0
        self.refuse: LMSPError | None = None
        self.invalid: LMSPError | None = None

    async def check_request(self, request: ResponseRequest) -> None:
        if self.invalid is not None:
            raise self.invalid

    async def start_response(self, request: ResponseRequest, *, response_id: str | None = None) -> FakeRun:
        self.attempts += 1
        if self.busy:
            self.busy -= 1
            raise TooManyRequests("The model's waiting line is full.", headers={"Retry-After": "0"})
        if self.refuse is not None:
            raise self.refuse
        run = FakeRun(request, response_id)
        self.started.append(run)
        self.runs.put_nowait(run)
        return run

    async def next_run(self) -> FakeRun:
        return await asyncio.wait_for(self.runs.get(), 10)


def request(text: str = "hello", **extra: Any) -> ResponseRequest:
    return parse_response_create({"model": "fake:1b", "input": text, **extra})


Scenario = Callable[[TaskManager, FakeService, Database], Awaitable[None]]


def play(tmp_path: Path, scenario: Scenario, **options: Any) -> None:
    with Database(tmp_path / "tasks.sqlite3") as db:

        async def main() -> None:
            service = FakeService()
            tasks = TaskManager(service, db, Conversations(db), Idempotency(db), **options)
            try:
                await scenario(tasks, service, db)
            finally:
                await tasks.stop(timeout=5)

        asyncio.run(main())


async def read_all(tasks: TaskManager, task_id: str, after: int = 0) -> list[Event]:
    return [e async for e in await tasks.open_events(task_id, after)]


def names(events: list[Event]) -> list[str]:
    return [e.name for e in events]


def test_a_task_runs_and_its_events_are_read_live_and_from_the_store(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        task, replayed = await tasks.create(request())
        assert task.status == "queued" and not replayed
        run = await service.next_run()
        assert run.response_id == task.response_id
        live = asyncio.ensure_future(read_all(tasks, task.id))
        run.say("Hel")
        run.say("lo")
        run.end()
        events = await live
        assert names(events)[0] == "response.created" and names(events)[-1] == "response.completed"
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert "".join(e.data["delta"] for e in events if e.name == "response.output_text.delta") == "Hello"
        done = await tasks.get(task.id)
        assert done.status == "completed" and done.response is not None
        assert done.response["output"][0]["content"][0]["text"] == "Hello"
        await until(lambda: tasks.running == 0, what="the worker to finish")
        assert await read_all(tasks, task.id) == events  # now from the store
        assert await read_all(tasks, task.id, after=3) == events[3:]

    play(tmp_path, scenario)


def test_at_most_max_running_oldest_first(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        first, _ = await tasks.create(request("first"))
        second, _ = await tasks.create(request("second"))
        run = await service.next_run()
        assert run.response_id == first.response_id
        assert (await tasks.get(second.id)).status == "queued" and service.runs.empty()
        run.end()
        after = await service.next_run()
        assert after.response_id == second.response_id
        assert (await tasks.get(first.id)).status == "completed"
        after.say("x")
        async for event in await tasks.open_events(second.id):
            if event.name == "response.output_text.delta":
                break
        assert (await tasks.get(second.id)).status == "in_progress"
        after.end()

    play(tmp_path, scenario, max_running=1)


def test_cancelling_a_queued_task_never_starts_it(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        await tasks.create(request("first"))
        queued, _ = await tasks.create(request("queued"))
        run = await service.next_run()
        cancelled = await tasks.cancel(queued.id)
        assert cancelled.status == "cancelled"
        assert [(e.id, e.name) for e in await read_all(tasks, queued.id)] == [
            (1, "response.created"),
            (2, "response.cancelled"),
        ]
        run.end()
        await until(lambda: tasks.running == 0, what="the first task to finish")
        assert len(service.started) == 1  # the cancelled one never reached the service
        assert (await tasks.cancel(queued.id)).status == "cancelled"  # again: unchanged

    play(tmp_path, scenario, max_running=1)


def test_cancelling_a_running_task_keeps_its_output(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        task, _ = await tasks.create(request())
        run = await service.next_run()
        run.say("partial")
        async for event in await tasks.open_events(task.id):  # as a client would: until the text is out
            if event.name == "response.output_text.delta":
                break
        cancelled = await tasks.cancel(task.id)
        assert cancelled.status == "cancelled" and run.cancelled_with == [None]
        events = await read_all(tasks, task.id)
        assert names(events)[-1] == "response.cancelled"
        assert cancelled.response is not None and cancelled.response["output"][0]["content"][0]["text"] == "partial"

    play(tmp_path, scenario)


def test_shutdown_fails_running_tasks_and_keeps_queued_ones_for_the_next_start(tmp_path: Path) -> None:
    kept: list[TaskRecord] = []

    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        running, _ = await tasks.create(request("running"))
        queued, _ = await tasks.create(request("queued"))
        run = await service.next_run()
        await tasks.stop(timeout=5)
        ended = await tasks.get(running.id)
        assert ended.status == "failed" and ended.error is not None
        assert ended.error["code"] == "service_unavailable" and run.cancelled_with[0] is not None
        assert (await tasks.get(queued.id)).status == "queued" and len(service.started) == 1
        kept.append(await db.aread(task_store.get, queued.id))

    play(tmp_path, scenario, max_running=1)

    async def next_start(tasks: TaskManager, service: FakeService, db: Database) -> None:
        tasks.resume(kept)
        run = await service.next_run()
        run.end()
        events = await read_all(tasks, kept[0].id)
        assert names(events)[-1] == "response.completed"

    play(tmp_path, next_start)


def test_a_full_waiting_line_keeps_the_task_queued_until_the_model_takes_it(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        service.busy = 2
        task, _ = await tasks.create(request())
        run = await service.next_run()
        assert service.attempts == 3
        run.end()
        events = await read_all(tasks, task.id)
        assert names(events)[0] == "response.created" and events[0].id == 1  # no trace of the 429s
        assert (await tasks.get(task.id)).status == "completed"

    play(tmp_path, scenario)


def test_a_task_the_service_refuses_ends_failed_with_its_error(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        service.refuse = InputTooLong("The input is 900 tokens; the window is 512.", param="input")
        task, _ = await tasks.create(request())
        events = await read_all(tasks, task.id)
        assert [(e.id, e.name) for e in events] == [(1, "response.created"), (2, "response.failed")]
        ended = await tasks.get(task.id)
        assert ended.status == "failed" and ended.error is not None
        assert ended.error["code"] == "context_length_exceeded"

    play(tmp_path, scenario)


def test_a_request_the_service_refuses_creates_no_task(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        service.invalid = InvalidRequest("No such model.", param="model")
        with pytest.raises(InvalidRequest):
            await tasks.create(request())
        assert (await tasks.list_tasks()).items == [] and service.attempts == 0

    play(tmp_path, scenario)


def test_a_run_that_breaks_ends_the_task_failed_not_hanging(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        task, _ = await tasks.create(request())
        run = await service.next_run()
        run.say("so far")
        run.crash()
        events = await read_all(tasks, task.id)
        assert names(events)[-1] == "response.failed" and events[-1].data["error"]["code"] == "internal_error"
        assert (await tasks.get(task.id)).status == "failed"

    play(tmp_path, scenario)


def test_a_store_failure_while_committing_ends_the_task_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tasks_module._commit
    calls = []

    def failing(conn: Any, task_id: str, rows: list[tuple], final: tuple | None) -> None:
        calls.append(len(rows))
        if len(calls) == 2:
            raise sqlite3.OperationalError("disk I/O error")
        real(conn, task_id, rows, final)

    monkeypatch.setattr(tasks_module, "_commit", failing)

    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        task, _ = await tasks.create(request())
        run = await service.next_run()
        await until(lambda: calls, what="the first commit")
        run.say("lost")
        events = await read_all(tasks, task.id)
        assert names(events)[-1] == "response.failed" and events[-1].data["error"]["code"] == "internal_error"
        assert [e.id for e in events] == list(range(1, len(events) + 1))  # still well-formed
        assert run.cancelled_with == [None]  # the run was stopped
        assert (await tasks.get(task.id)).status == "failed"

    play(tmp_path, scenario)


def test_idempotency_keys_and_owners(tmp_path: Path) -> None:
    async def scenario(tasks: TaskManager, service: FakeService, db: Database) -> None:
        mine = Caller("tok_a", "tok_a")
        task, replayed = await tasks.create(request(), caller=mine, key="k1")
        again, replayed_again = await tasks.create(request(), caller=mine, key="k1")
        assert (again.id, replayed, replayed_again) == (task.id, False, True)
        with pytest.raises(IdempotencyKeyReused):
            await tasks.create(request("other body"), caller=mine, key="k1")
        with pytest.raises(TaskNotFound):
            await tasks.get(task.id, caller=Caller("tok_b", "tok_b"))
        with pytest.raises(TaskNotFound) as cursor:
            await tasks.list_tasks(caller=mine, after="task_nope")
        assert cursor.value.param == "after"
        assert [t.id for t in (await tasks.list_tasks(caller=mine)).items] == [task.id]
        (await service.next_run()).end()

    play(tmp_path, scenario)
