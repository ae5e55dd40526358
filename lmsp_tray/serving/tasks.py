"""Tasks: responses that run in the background, with a persistent, resumable event stream.

Why: a direct stream belongs to its connection; a task does not. `POST
/tasks` stores the request and answers at once; `TaskManager` runs queued
tasks (at most ``max_running`` at a time, oldest first) through the same
service as `POST /responses`, so a task's events are exactly those of a
direct stream, ids from 1.

Written, then sent: each batch of events is committed to the event log
before any reader sees it (events produced while a commit is in flight
form the next batch, so a fast model costs one fsync per batch, not per
token). The terminal event, the task's final state and — with `store:
true` — the stored response are one transaction.

Readers: every running task has a `TaskFeed` holding its committed events
since id 1; any number of `GET /tasks/{id}/events` readers follow it, each
from its own resume point. A finished task is read from the store (`410
event_history_expired` once the events passed the retention).

Lifecycle (see also `recovery`):
- cancel: a queued task ends `cancelled` at once (events `response.created`,
  `response.cancelled`); a running one stops within one decode step and
  ends with `response.cancelled`;
- shutdown (`stop`): running tasks end `failed` with code
  `service_unavailable` ("the service stopped"), a terminal event in the log
  — a clean stop is never reported as `service_restarted`; queued tasks stay
  queued and run at the next start;
- crash: the next start ends the interrupted tasks `failed` with
  `service_restarted` (`recovery.end_interrupted`) and runs the queued ones.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from lmsp_tray.errors import (
    InternalError,
    InvalidRequest,
    LMSPError,
    ServiceUnavailable,
    TaskNotFound,
    TooManyRequests,
    quote,
)
from lmsp_tray.ids import new_id
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.requests import ResponseRequest, parse_response_create
from lmsp_tray.protocol.states import TaskStatus
from lmsp_tray.serving import storage
from lmsp_tray.serving.conversations import Conversations, PreparedRequest
from lmsp_tray.serving.recovery import end_task
from lmsp_tray.serving.replay import ANONYMOUS, Caller, Claim, Idempotency, Replay
from lmsp_tray.serving.running import Responses, Run
from lmsp_tray.store import Database, event_log, stored_responses
from lmsp_tray.store import idempotency_keys as keys
from lmsp_tray.store import task_rows as task_store
from lmsp_tray.store.task_rows import RESPONSE, TASK_STATUSES, TaskPage, TaskRecord

log = logging.getLogger("lmsp_tray.serving.tasks")

DEFAULT_MAX_RUNNING = 4
DEFAULT_MAX_QUEUED_PER_OWNER = 64  # one token's tasks waiting to start; the next one is 429 (config: max_queued_tasks)
CANCEL_WAIT_S = 10.0
POLL_S = 0.25  # only for a task this process does not run (never expected)
MAX_LIST_LIMIT = 100


def task_object(task: TaskRecord) -> dict[str, Any]:
    """The task as PROFILE §4 describes it; a task of another kind says which, and a download's state is in
    `download` (its `response` stays null)."""
    obj = {
        "id": task.id,
        "object": "task",
        "status": task.status,
        "created_at": int(task.created_at),
        "updated_at": int(task.updated_at),
        "response_id": task.response_id,
        "response": task.response,
        "error": task.error,
    }
    if task.kind != RESPONSE:  # e.g. "model.download": its object, not a response
        obj["kind"] = task.kind
        obj["response"] = None
        obj["download"] = task.response
    return obj


class TaskKind(Protocol):
    """Tasks of another kind than a background response (`downloads.DownloadTasks`): they run themselves;
    `TaskManager` hands them cancel and event reads, and lists and shows them with the others."""

    async def cancel(self, task: TaskRecord) -> TaskRecord: ...
    async def open_events(self, task: TaskRecord, after: int) -> AsyncIterator[Event]: ...


class TaskFeed:
    """The committed events of one task run by this process, for any number of readers."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.events: list[Event] = []  # events[i].id == i + 1
        self.closed = False
        self.run: Run | None = None
        self.cancel_requested = False
        self._waiters: list[asyncio.Future] = []

    def publish(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.id != len(self.events) + 1:
                raise AssertionError(f"{self.task_id}: event {event.id} published after {len(self.events)}")
            self.events.append(event)
            if event.terminal:
                self.closed = True
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _changed(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await fut

    async def wait_closed(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                while not self.closed:
                    await self._changed()
        except TimeoutError:
            return False
        return True

    async def follow(self, after: int) -> AsyncIterator[Event]:
        """Events with id > ``after`` as they are committed, up to the terminal one."""
        index = max(0, after)
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                yield event
                if event.terminal:
                    return
            if self.closed:
                return
            await self._changed()


class TaskManager:
    """Creates, runs, cancels and lists tasks; serves their event streams."""

    def __init__(
        self,
        service: Responses,
        db: Database,
        conversations: Conversations,
        idempotency: Idempotency,
        *,
        max_running: int = DEFAULT_MAX_RUNNING,
        max_queued_per_owner: int | None = DEFAULT_MAX_QUEUED_PER_OWNER,
    ) -> None:
        self.service = service
        self.db = db
        self.conversations = conversations
        self.idempotency = idempotency
        self.max_running = max(1, max_running)
        self.max_queued_per_owner = max_queued_per_owner  # None: no cap
        self._owner_of: dict[str, str | None] = {}  # the owner of each task waiting to start
        self._reserved: collections.Counter[str] = collections.Counter()  # creates between check and queue
        self._feeds: dict[str, TaskFeed] = {}
        self._waiting: collections.deque[str] = collections.deque()
        self._active: dict[str, asyncio.Task] = {}
        self._stopping = False
        self._kinds: dict[str, TaskKind] = {}
        self._shutdown_error = ServiceUnavailable(
            "The service stopped while this task was running; create the task again."
        )

    def register_kind(self, kind: str, handler: TaskKind) -> None:
        """Tasks of `kind` are cancelled and read through `handler`."""
        self._kinds[kind] = handler

    # -- start-up and shutdown -------------------------------------------------------------------
    def resume(self, queued: Iterable[TaskRecord]) -> None:
        """Take the tasks the last run left queued (oldest first); call on the event loop before serving."""
        for task in queued:
            if task.id not in self._feeds:
                self._feeds[task.id] = TaskFeed(task.id)
                self._waiting.append(task.id)
                self._owner_of[task.id] = task.owner
        self._dispatch()

    def begin_shutdown(self) -> None:
        """Stop starting tasks; running ones end `failed` (`service_unavailable`) within one step."""
        self._stopping = True
        for feed in self._feeds.values():
            if feed.run is not None:
                feed.run.cancel(self._shutdown_error)

    async def stop(self, timeout: float = 10.0) -> None:
        """`begin_shutdown`, then wait for running tasks to write their terminal events."""
        self.begin_shutdown()
        active = list(self._active.values())
        if active:
            await asyncio.wait(active, timeout=timeout)

    @property
    def running(self) -> int:
        return len(self._active)

    # -- requests ---------------------------------------------------------------------------------
    async def create(
        self, request: ResponseRequest, *, caller: Caller = ANONYMOUS, key: str | None = None
    ) -> tuple[TaskRecord, bool]:
        """Queue a task; returns it and whether it is an idempotent replay."""
        prepared = await self.conversations.prepare(request, owner=caller.owner)  # the chain must exist
        await self.service.check_request(prepared.request)  # 400/404 now rather than a failed task later
        if self._stopping:
            raise ServiceUnavailable("The service is shutting down; create the task again once it is back.")
        claim: Claim | None = None
        if key is not None:
            outcome = await self.idempotency.claim(caller, key, "tasks", request.raw, large=request.large)
            if isinstance(outcome, Replay):
                task = await storage.read(self.db, task_store.get, str(outcome.result.get("task_id")))
                if task is None:
                    raise TaskNotFound("The task this Idempotency-Key created is no longer kept.")
                return task, True
            claim = outcome
        owner = caller.owner
        try:
            self._reserve_queue_place(owner)  # no await between the count and the reservation
        except BaseException:
            if claim is not None:
                self.idempotency.release(claim)
            raise
        task_id, response_id = new_id("task"), new_id("resp")
        self._feeds[task_id] = feed = TaskFeed(task_id)  # before the commit: a reader must find it
        try:
            task = await storage.write(self.db, _create, task_id, request.raw, response_id, owner, claim)
        except BaseException:
            self._feeds.pop(task_id, None)
            feed.close()
            if claim is not None:
                self.idempotency.release(claim)
            raise
        finally:
            if owner is not None:
                self._reserved[owner] -= 1
        self._waiting.append(task_id)
        self._owner_of[task_id] = owner
        self._dispatch()
        return task, False

    def _reserve_queue_place(self, owner: str | None) -> None:
        """Count a place in the queue for `owner`, or refuse with 429 when its tasks fill its share."""
        cap = self.max_queued_per_owner
        if owner is None:
            return
        if cap is not None:
            queued = sum(1 for t in self._waiting if self._owner_of.get(t) == owner) + self._reserved[owner]
            if queued >= cap:
                retry = max(1, min(60, queued // self.max_running))
                raise TooManyRequests(
                    f"This token already has {queued} tasks waiting to start, its limit (max_queued_tasks = {cap}); "
                    "wait for some to start, or cancel some, and retry.",
                    headers={"Retry-After": str(retry)},
                )
        self._reserved[owner] += 1

    async def get(self, task_id: str, *, caller: Caller = ANONYMOUS) -> TaskRecord:
        task = await storage.read(self.db, task_store.get, task_id, owner=caller.owner)
        if task is None:
            raise TaskNotFound(f"No task {quote(task_id)}. GET /lmsp/v1/tasks lists the tasks that are kept.")
        return task

    async def list_tasks(
        self, *, caller: Caller = ANONYMOUS, status: list[str] | None = None, limit: int = 20, after: str | None = None
    ) -> TaskPage:
        if status:
            unknown = [s for s in status if s not in TASK_STATUSES]
            if unknown:
                raise InvalidRequest(
                    f"Unknown task status '{unknown[0]}'; use one of {', '.join(TASK_STATUSES)}.", param="status"
                )
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}.", param="limit")
        return await storage.read(
            self.db, task_store.list_tasks, status=status or None, owner=caller.owner, limit=limit, after=after
        )

    async def cancel(self, task_id: str, *, caller: Caller = ANONYMOUS) -> TaskRecord:
        """End a queued or running task `cancelled`; a finished task is returned unchanged."""
        task = await self.get(task_id, caller=caller)
        if task.terminal:
            return task
        if task.kind in self._kinds:
            return await self._kinds[task.kind].cancel(task)
        feed = self._feeds.get(task_id)
        if feed is not None:
            feed.cancel_requested = True
        if feed is None or task_id in self._waiting:  # not started: end it here
            if task_id in self._waiting:
                self._waiting.remove(task_id)
                self._owner_of.pop(task_id, None)
            await self._end_unstarted(task, TaskStatus.CANCELLED)
        elif feed.run is not None:
            feed.run.cancel()
        if feed is not None:
            await feed.wait_closed(CANCEL_WAIT_S)  # a starting task cancels as soon as its run exists
        return await self.get(task_id, caller=caller)

    async def open_events(self, task_id: str, after: int = 0, *, caller: Caller = ANONYMOUS) -> AsyncIterator[Event]:
        """The task's events with id > ``after``; 404 / 410 are raised here, before any byte is sent."""
        task = await self.get(task_id, caller=caller)
        if task.kind in self._kinds:
            return await self._kinds[task.kind].open_events(task, after)
        feed = self._feeds.get(task_id)
        if feed is not None:
            return feed.follow(after)
        stored = await storage.read(self.db, event_log.read_events, task_id, after)  # 410 when expired
        return self._from_store(task, after, stored)

    async def _from_store(self, task: TaskRecord, after: int, stored: list) -> AsyncIterator[Event]:
        last = after
        while True:
            for item in stored:
                event = Event(item.seq, item.event, item.payload())
                last = item.seq
                yield event
                if event.terminal:
                    return
            current = await storage.read(self.db, task_store.get, task.id)
            if current is None or current.terminal:
                if current is not None:  # the terminal event may have landed after the first read
                    for item in await storage.read(self.db, event_log.read_events, task.id, last):
                        yield Event(item.seq, item.event, item.payload())
                return
            feed = self._feeds.get(task.id)
            if feed is not None:
                async for event in feed.follow(last):
                    yield event
                return
            await asyncio.sleep(POLL_S)
            stored = await storage.read(self.db, event_log.read_events, task.id, last)

    # -- running ----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while self._waiting and len(self._active) < self.max_running and not self._stopping:
            task_id = self._waiting.popleft()
            self._owner_of.pop(task_id, None)
            worker = asyncio.ensure_future(self._run(task_id))
            self._active[task_id] = worker
            worker.add_done_callback(functools.partial(self._worker_done, task_id))

    def _worker_done(self, task_id: str, _worker: object = None) -> None:
        self._active.pop(task_id, None)
        feed = self._feeds.get(task_id)
        if feed is not None and feed.closed:
            self._feeds.pop(task_id, None)
        self._dispatch()

    async def _run(self, task_id: str) -> None:
        feed = self._feeds[task_id]
        try:
            await self._run_task(task_id, feed)
        except Exception:
            log.exception("task %s failed unexpectedly", task_id)
            if not feed.closed:
                await self._fail_in_store(
                    task_id, feed, InternalError("The task failed unexpectedly; it has been logged.")
                )
        finally:
            if feed.closed:
                self._feeds.pop(task_id, None)

    async def _run_task(self, task_id: str, feed: TaskFeed) -> None:
        task = await storage.read(self.db, task_store.get, task_id)
        if task is None or task.terminal:
            feed.close()
            return
        if feed.cancel_requested:
            await self._end_unstarted(task, TaskStatus.CANCELLED)
            return
        try:
            request = await asyncio.to_thread(parse_response_create, task.request)  # it may be long
            prepared = await self.conversations.prepare(request, owner=task.owner)
            try:
                run = await self.service.start_response(prepared.request, response_id=task.response_id)
            except LMSPError as exc:
                raise prepared.explain(exc) from None
        except TooManyRequests as exc:  # the model's waiting line is full: wait, stay queued
            await asyncio.sleep(min(5.0, max(0.5, float(exc.headers.get("Retry-After", "1")))))
            if not self._stopping and not feed.cancel_requested:
                self._waiting.appendleft(task_id)
                self._owner_of[task_id] = task.owner
            elif feed.cancel_requested:
                await self._end_unstarted(task, TaskStatus.CANCELLED)
            return
        except LMSPError as exc:
            await self._end_unstarted(task, TaskStatus.FAILED, exc)
            return
        feed.run = run
        if self._stopping:
            run.cancel(self._shutdown_error)
        elif feed.cancel_requested:
            run.cancel()
        if await storage.write(self.db, task_store.mark_in_progress, task_id, response_id=run.response_id) is None:
            run.cancel()  # ended meanwhile
            async for _ in run.events():
                pass
            feed.close()
            return
        await self._pump(task_id, feed, run, prepared)

    async def _pump(self, task_id: str, feed: TaskFeed, run: Run, prepared: PreparedRequest) -> None:
        """Commit the run's events in batches, publishing each batch after its commit."""
        buffer: list[Event] = []
        wake = asyncio.Event()

        async def produce() -> None:
            try:
                async for event in run.events():
                    buffer.append(event)
                    wake.set()
            except Exception:
                log.exception("task %s: the response failed unexpectedly", task_id)
                if not run.assembler.finished:
                    problem = InternalError("The response failed unexpectedly; it has been logged.").to_problem()
                    buffer.extend(run.assembler.fail(problem))
            finally:
                wake.set()

        producer = asyncio.ensure_future(produce())
        try:
            while True:
                await wake.wait()
                wake.clear()
                batch, buffer[:] = list(buffer), []
                if not batch:
                    if producer.done():
                        raise InternalError("the response ended without a terminal event")
                    continue
                final = None
                if batch[-1].terminal:
                    response = run.assembler.response()
                    final = (
                        response["status"],
                        response,
                        response.get("error"),
                        prepared.stored(response) if prepared.store else None,
                    )
                rows = [(e.id, e.name, e.data) for e in batch]
                try:
                    await self.db.awrite(_commit, task_id, rows, final)
                except Exception as exc:  # noqa: BLE001 - any store failure ends the task, logged
                    log.error("task %s: could not write its events (%s); ending it", task_id, exc)
                    run.cancel()
                    await self._fail_in_store(
                        task_id,
                        feed,
                        InternalError("The service could not record this task's events; it has been logged."),
                    )
                    return
                feed.publish(batch)
                if final is not None:
                    return
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    async def _end_unstarted(self, task: TaskRecord, status: TaskStatus, error: LMSPError | None = None) -> None:
        """End a task that has no run (queued, or failed to start) after whatever its log holds."""
        problem = error.to_problem() if error is not None else None
        events = await storage.write(self.db, end_task, task.id, status, problem)
        self._settle(task.id, events)

    async def _fail_in_store(self, task_id: str, feed: TaskFeed, error: LMSPError) -> None:
        """Last resort after a failed write: end the task after whatever its log holds."""
        try:
            events = await self.db.awrite(end_task, task_id, TaskStatus.FAILED, error.to_problem())
        except Exception:
            log.exception("task %s: could not be ended in the store", task_id)
            events = None
        self._settle(task_id, events)

    def _settle(self, task_id: str, events: list[Event] | None) -> None:
        """Publish a task's last events (already committed) and close its feed."""
        feed = self._feeds.get(task_id)
        if feed is None:
            return
        if events and events[0].id == len(feed.events) + 1:
            feed.publish(events)
        feed.close()  # readers stop; anything they missed is read from the store
        if task_id not in self._active:
            self._feeds.pop(task_id, None)


def _create(
    conn: Any, task_id: str, body: dict[str, Any], response_id: str, owner: str | None, claim: Claim | None
) -> TaskRecord:
    task = task_store.create(conn, task_id, body, response_id=response_id, owner=owner)
    if claim is not None:
        keys.finish(conn, claim.scope, claim.key, {"kind": "task", "task_id": task_id})
    return task


def _commit(conn: Any, task_id: str, rows: list[tuple], final: tuple | None) -> None:
    if final is None:
        event_log.append_events(conn, task_id, rows)
        return
    status, response, error, stored = final
    task_store.finish(conn, task_id, status, response=response, error=error, events=rows)
    if stored is not None:
        stored_responses.save(conn, stored)
