"""Model downloads as durable tasks: `POST /models/pull` starts one, the task's event stream follows it.

Why a task: a download takes minutes to hours and must outlive the request
that started it, be followed (and resumed, `Last-Event-ID`) by any reader, be
cancelled, and survive the service stopping. So it is a row in the tasks table
(kind ``model.download``), its events go to the same event log, written before
they are sent (`protocol.downloads` names them), and `TaskManager` hands
cancel and event reads of this kind to `DownloadTasks`.

- create: the pull is planned (repository, variant, files, fit) and the disk
  checked *before* the task exists, so a bad name, a gated repository or a
  full disk is the request's problem document (`hub.errors`); then the task is
  stored with its plan (the commit is fixed) and starts at once;
- `Idempotency-Key` (`serving.replay`, as on `POST /tasks`): the key is claimed
  before planning and finished in the write that stores the task, so a retry
  of a pull whose answer was lost gets the same task (`Idempotent-Replayed`)
  and never a second download; a pull that fails before its task exists
  releases the key;
- running: `hub.pull.Puller.run` on a thread; progress becomes events at most
  every `progress_every` seconds (and on each change of phase or file), each
  committed with the task's current `download` object (`GET /tasks/{id}` shows
  it) before readers see it;
- done: the files are linked into the Hugging Face cache; `model_for` (the
  daemon: a catalog rescan) gives the model object, so the model is in `GET
  /models` when ``model.download.completed`` arrives;
- cancel: ends ``cancelled``; the part fetched stays in the cache, so pulling
  the same model again resumes it (and another pull of the same file goes on);
- stop (shutdown) and crash: a running download goes back to ``queued`` with a
  ``model.download.paused`` event and resumes when the service starts again.

Listeners (the tray) get a `DownloadStatus` on every change, and `active()`
lists the running downloads; both are safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lmsp_tray.errors import InternalError, InvalidRequest, LMSPError, ServiceUnavailable, TaskNotFound
from lmsp_tray.hub.errors import DownloadCancelled
from lmsp_tray.hub.pull import Puller, PullPlan, PullProgress, PullResult
from lmsp_tray.hub.transfer import CancelToken
from lmsp_tray.ids import new_id
from lmsp_tray.protocol import downloads as ev
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.states import TaskStatus
from lmsp_tray.serving import storage
from lmsp_tray.serving.replay import ANONYMOUS, Caller, Claim, Idempotency, Replay
from lmsp_tray.serving.tasks import TaskFeed
from lmsp_tray.store import Database, event_log
from lmsp_tray.store import idempotency_keys as keys
from lmsp_tray.store import task_rows as task_store
from lmsp_tray.store.task_rows import TaskRecord

log = logging.getLogger("lmsp_tray.serving.downloads")

PROGRESS_EVERY_S = 1.0
SHUTDOWN = "service_stopped"
RESTARTED = "service_restarted"


@dataclass(frozen=True)
class DownloadStatus:
    """What the tray shows of a download."""

    task_id: str
    ref: str
    state: str  # "queued" | "running" | "completed" | "failed" | "cancelled"
    bytes_done: int = 0
    bytes_total: int = 0
    bytes_per_second: float | None = None
    eta_seconds: int | None = None
    model_id: str | None = None
    error: str | None = None


def parse_pull(body: Any) -> tuple[str, bool]:
    """`{"model": "<hf ref>", "include_mmproj": true}` → (ref, include_mmproj)."""
    if not isinstance(body, dict):
        raise InvalidRequest('The body must be a JSON object: {"model": "hf.co/org/repo:QUANT"}.')
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("'model' must name a model on Hugging Face, e.g. hf.co/org/repo:Q4_K_M.", param="model")
    projector = body.get("include_mmproj", True)
    if not isinstance(projector, bool):
        raise InvalidRequest("'include_mmproj' must be true or false.", param="include_mmproj")
    return model.strip(), projector


def download_object(plan: PullPlan, *, progress: PullProgress | None = None, **extra: Any) -> dict[str, Any]:
    """The task's `download` member: the plan, the latest progress, and once done the model's id."""
    doc = {"object": "model.download", **plan.to_json(), "progress": progress.to_json() if progress else None}
    doc["model"] = doc.pop("ref")
    doc.update(extra)
    return doc


class _Run:
    """One download task this process runs: its feed, its cancel token, what the tray shows."""

    def __init__(self, task: TaskRecord, plan: PullPlan, feed: TaskFeed) -> None:
        self.task = task
        self.plan = plan
        self.feed = feed
        self.token = CancelToken()
        self.progress: PullProgress | None = None
        self.status = DownloadStatus(task.id, plan.ref, "queued", bytes_total=plan.total_bytes)
        self.worker: asyncio.Task | None = None


class DownloadTasks:
    """Creates, runs, cancels and resumes model download tasks; serves their events."""

    kind = ev.KIND

    def __init__(
        self,
        puller: Puller,
        db: Database,
        *,
        model_for: Callable[[Path], dict[str, Any] | None] = lambda _path: None,
        progress_every: float = PROGRESS_EVERY_S,
        idempotency: Idempotency | None = None,
    ) -> None:
        self.puller = puller
        self.db = db
        self.idempotency = idempotency or Idempotency(db)
        self.model_for = model_for
        self.progress_every = progress_every
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()  # guards what other threads read: the runs' statuses, listeners
        self._listeners: list[Callable[[DownloadStatus], None]] = []
        self._stopping = False

    # -- observation (any thread) --------------------------------------------------------------------
    def subscribe(self, listener: Callable[[DownloadStatus], None]) -> None:
        """`listener(status)` after every change (progress too); it must be quick."""
        with self._lock:
            self._listeners.append(listener)

    def active(self) -> list[DownloadStatus]:
        with self._lock:
            return [r.status for r in self._runs.values()]

    def cancel_soon(self, task_id: str) -> bool:
        """Ask a running download to stop (from any thread: the tray); it ends ``cancelled`` as through
        `POST /tasks/{id}/cancel`. False when this process runs no such download."""
        with self._lock:
            run = self._runs.get(task_id)
        if run is None:
            return False
        run.token.cancel("cancelled")
        return True

    def _set_status(self, run: _Run, **changes: Any) -> None:
        with self._lock:
            run.status = replace(run.status, **changes)
            status, listeners = run.status, list(self._listeners)
        for listener in listeners:
            try:
                listener(status)
            except Exception:  # a listener's bug must not stop a download
                log.exception("download listener failed")

    # -- requests -------------------------------------------------------------------------------------
    async def create(self, body: Any, *, caller: Caller = ANONYMOUS, key: str | None = None) -> tuple[TaskRecord, bool]:
        """Plan the pull and check the disk (errors are the request's), then store and start the task.

        Returns the task and whether it is an idempotent replay (`key` used before with this body)."""
        if self._stopping:
            raise ServiceUnavailable("The service is shutting down; start the download again once it is back.")
        model, projector = parse_pull(body)
        claim: Claim | None = None
        if key is not None:
            outcome = await self.idempotency.claim(caller, key, "models.pull", body)
            if isinstance(outcome, Replay):
                return await self._replayed(outcome), True
            claim = outcome
        try:
            plan = await asyncio.to_thread(self.puller.plan, model, projector=projector)
            await asyncio.to_thread(self.puller.check_space, plan)
            task_id = new_id("task")
            request = {"model": model, "include_mmproj": projector, "plan": plan.to_json()}
            first = ev.download_event(1, ev.CREATED, task_id, status=TaskStatus.QUEUED, download=download_object(plan))
            task = await storage.write(
                self.db, _create, task_id, request, caller.owner, first, download_object(plan), claim
            )
        except BaseException:
            if claim is not None:
                self.idempotency.release(claim)
            raise
        feed = TaskFeed(task_id)
        feed.publish([first])
        self._start(task, plan, feed)
        return task, False

    async def _replayed(self, replay: Replay) -> TaskRecord:
        task = await storage.read(self.db, task_store.get, str(replay.result.get("task_id")))
        if task is None:
            raise TaskNotFound("The download task this Idempotency-Key created is no longer kept.")
        return task

    def handles(self, task: TaskRecord) -> bool:
        return task.kind == ev.KIND

    async def cancel(self, task: TaskRecord) -> TaskRecord:
        """End a queued or running download `cancelled` (the part fetched is kept for a later pull)."""
        run = self._runs.get(task.id)
        if run is not None:
            run.token.cancel("cancelled")
            await run.feed.wait_closed(10.0)
        elif not task.terminal:  # queued by an earlier run and not started here (never expected)
            plan = PullPlan.from_json(task.request["plan"])
            await self._finish_unstarted(task, plan, TaskStatus.CANCELLED)
        current = await storage.read(self.db, task_store.get, task.id)
        return current or task

    async def open_events(self, task: TaskRecord, after: int) -> AsyncIterator[Event]:
        run = self._runs.get(task.id)
        if run is not None:
            return run.feed.follow(after)
        stored = await storage.read(self.db, event_log.read_events, task.id, after)  # 410 when expired
        return _iterate(Event(s.seq, s.event, s.payload()) for s in stored)

    # -- start-up and shutdown ------------------------------------------------------------------------
    def recover(self) -> list[TaskRecord]:
        """At start-up, before serving: downloads a stop or crash interrupted go back to the queue."""
        for task in self.db.read(task_store.unfinished, kind=ev.KIND):
            if task.status == TaskStatus.IN_PROGRESS:
                self.db.write_sync(_pause, task.id, RESTARTED, _bytes_done(task))
        return self.db.read(task_store.unfinished, kind=ev.KIND)

    def resume(self, queued: Iterable[TaskRecord]) -> None:
        """Start the queued downloads (oldest first); call on the event loop."""
        for task in queued:
            if task.id in self._runs or task.terminal:
                continue
            plan = PullPlan.from_json(task.request["plan"])
            stored = self.db.read(event_log.read_events, task.id)
            feed = TaskFeed(task.id)
            feed.publish([Event(s.seq, s.event, s.payload()) for s in stored])
            self._start(task, plan, feed)

    def begin_shutdown(self) -> None:
        """Stop starting downloads; running ones pause (back to queued) within a moment."""
        self._stopping = True
        for run in list(self._runs.values()):
            run.token.cancel(SHUTDOWN)

    async def stop(self, timeout: float = 10.0) -> None:
        self.begin_shutdown()
        workers = [r.worker for r in self._runs.values() if r.worker is not None]
        if workers:
            await asyncio.wait(workers, timeout=timeout)

    # -- running -------------------------------------------------------------------------------------
    def _start(self, task: TaskRecord, plan: PullPlan, feed: TaskFeed) -> None:
        run = _Run(task, plan, feed)
        with self._lock:
            self._runs[task.id] = run
        run.worker = asyncio.ensure_future(self._run(run))
        run.worker.add_done_callback(functools.partial(self._forget, task.id))

    def _forget(self, task_id: str, _worker: object = None) -> None:
        with self._lock:
            run = self._runs.pop(task_id, None)
        if run is not None and not run.feed.closed:
            run.feed.close()

    async def _run(self, run: _Run) -> None:
        try:
            await self._run_download(run)
        except Exception:
            log.exception("download task %s failed unexpectedly", run.task.id)
            with contextlib.suppress(Exception):
                await self._end(
                    run, TaskStatus.FAILED, error=InternalError("The download failed unexpectedly; it has been logged.")
                )

    async def _run_download(self, run: _Run) -> None:
        task, plan = run.task, run.plan
        if self._stopping:
            run.feed.close()
            return
        resumed = any(e.name == ev.STARTED for e in run.feed.events)
        fresh = self.puller.refreshed(plan)
        bytes_done = sum(f.spec.size if f.present else f.partial for f in fresh.files)
        started = ev.download_event(
            len(run.feed.events) + 1, ev.STARTED, task.id, bytes_done=bytes_done, resumed=resumed
        )
        if await self.db.awrite(_begin, task.id, started) is None:  # cancelled meanwhile
            run.feed.close()
            return
        run.feed.publish([started])
        self._set_status(run, state="running", bytes_done=bytes_done)
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        latest: list[PullProgress] = []

        def on_progress(p: PullProgress) -> None:  # on the transfer thread
            loop.call_soon_threadsafe(_note, latest, p, changed)

        worker = asyncio.ensure_future(asyncio.to_thread(self.puller.run, plan, on_progress, run.token))
        last_sent: PullProgress | None = None
        last_at = 0.0
        while not worker.done():
            waiter = asyncio.ensure_future(changed.wait())
            await asyncio.wait({worker, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            changed.clear()
            if not latest:
                continue
            p = latest[-1]
            now = time.monotonic()
            step = last_sent is None or p.phase != last_sent.phase or p.files_done != last_sent.files_done
            if step or now - last_at >= self.progress_every:
                await self._progress(run, p)
                last_sent, last_at = p, now
            elif not worker.done():
                await asyncio.sleep(min(self.progress_every - (now - last_at), self.progress_every))
                changed.set()  # look again: send the newest progress now that it is time
        if latest and latest[-1] is not last_sent:  # the transfer's last word came as it ended
            await self._progress(run, latest[-1])
        try:
            result: PullResult = worker.result()
        except DownloadCancelled as exc:
            if exc.reason == SHUTDOWN:
                await self._pause(run)
            else:
                await self._end(run, TaskStatus.CANCELLED)
            return
        except LMSPError as exc:
            await self._end(run, TaskStatus.FAILED, error=exc)
            return
        model = await asyncio.to_thread(self._model_object, result)
        await self._end(run, TaskStatus.COMPLETED, result=result, model=model)

    def _model_object(self, result: PullResult) -> dict[str, Any] | None:
        try:
            return self.model_for(result.model_path)
        except Exception:
            log.exception("could not find the downloaded model in the catalog")
            return None

    async def _progress(self, run: _Run, p: PullProgress) -> None:
        run.progress = p
        event = ev.download_event(len(run.feed.events) + 1, ev.PROGRESS, run.task.id, **p.to_json())
        await self.db.awrite(_append, run.task.id, event, download_object(run.plan, progress=p))
        run.feed.publish([event])
        self._set_status(run, bytes_done=p.bytes_done, bytes_per_second=p.bytes_per_second, eta_seconds=p.eta_seconds)

    async def _pause(self, run: _Run) -> None:
        done = run.progress.bytes_done if run.progress else run.status.bytes_done
        event = ev.download_event(len(run.feed.events) + 1, ev.PAUSED, run.task.id, reason=SHUTDOWN, bytes_done=done)
        await self.db.awrite(_requeue, run.task.id, event)
        run.feed.publish([event])
        run.feed.close()
        self._set_status(run, state="queued")

    async def _end(
        self,
        run: _Run,
        status: TaskStatus,
        *,
        error: LMSPError | None = None,
        result: PullResult | None = None,
        model: dict[str, Any] | None = None,
    ) -> None:
        events, record = _terminal(
            run.task.id, len(run.feed.events) + 1, run.plan, status, run.progress, error, result, model
        )
        await self.db.awrite(_finish, run.task.id, status, events, record, error)
        run.feed.publish(events)
        self._set_status(
            run,
            state=status,
            bytes_done=run.plan.total_bytes if status == TaskStatus.COMPLETED else run.status.bytes_done,
            model_id=(model or {}).get("id"),
            error=error.detail if error else None,
        )

    async def _finish_unstarted(self, task: TaskRecord, plan: PullPlan, status: TaskStatus) -> None:
        last = await self.db.aread(event_log.last_event_seq, task.id)
        events, record = _terminal(task.id, last + 1, plan, status, None, None, None, None)
        await self.db.awrite(_finish, task.id, status, events, record, None)


# -- helpers -----------------------------------------------------------------------------------------
def _note(latest: list[PullProgress], p: PullProgress, changed: asyncio.Event) -> None:
    latest[:] = [p]
    changed.set()


async def _iterate(events: Iterable[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


def _bytes_done(task: TaskRecord) -> int:
    progress = (task.response or {}).get("progress") or {}
    return int(progress.get("bytes_done") or 0)


def _terminal(
    task_id: str,
    seq: int,
    plan: PullPlan,
    status: TaskStatus,
    progress: PullProgress | None,
    error: LMSPError | None,
    result: PullResult | None,
    model: dict[str, Any] | None,
) -> tuple[list[Event], dict[str, Any]]:
    if status == TaskStatus.COMPLETED and result is not None:
        record = download_object(
            plan,
            progress=progress,
            model_id=(model or {}).get("id"),
            fit=result.fit.to_json() if result.fit else None,
            fetched_bytes=result.fetched_bytes,
            already_present=result.already_present,
        )
        if record["progress"] is not None:
            record["progress"] = {**record["progress"], "bytes_done": plan.total_bytes, "eta_seconds": 0}
        return [ev.download_event(seq, ev.COMPLETED, task_id, status=status, download=record, model=model)], record
    record = download_object(plan, progress=progress)
    if status == TaskStatus.FAILED:
        problem = (error or InternalError("The download failed.")).to_problem()
        return [ev.download_event(seq, ev.FAILED, task_id, status=status, download=record, error=problem)], record
    kept = progress.bytes_done if progress else 0
    return [ev.download_event(seq, ev.CANCELLED, task_id, status=status, download=record, bytes_kept=kept)], record


def _rows(events: Iterable[Event]) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.id, e.name, e.data) for e in events]


def _create(
    conn: Any,
    task_id: str,
    request: dict[str, Any],
    owner: str | None,
    first: Event,
    record: dict[str, Any],
    claim: Claim | None,
) -> TaskRecord:
    task_store.create(conn, task_id, request, owner=owner, kind=ev.KIND)
    event_log.append_events(conn, task_id, _rows([first]))
    task_store.set_result(conn, task_id, record)
    if claim is not None:  # in the same write: a crash cannot keep the key without the task
        keys.finish(conn, claim.scope, claim.key, {"kind": "task", "task_id": task_id})
    task = task_store.get(conn, task_id)
    assert task is not None
    return task


def _begin(conn: Any, task_id: str, started: Event) -> TaskRecord | None:
    task = task_store.mark_in_progress(conn, task_id)
    if task is not None:
        event_log.append_events(conn, task_id, _rows([started]))
    return task


def _append(conn: Any, task_id: str, event: Event, record: dict[str, Any]) -> None:
    event_log.append_events(conn, task_id, _rows([event]))
    task_store.set_result(conn, task_id, record)


def _requeue(conn: Any, task_id: str, event: Event) -> None:
    task_store.requeue(conn, task_id, events=_rows([event]))


def _finish(
    conn: Any, task_id: str, status: TaskStatus, events: list[Event], record: dict[str, Any], error: LMSPError | None
) -> None:
    task_store.finish(
        conn, task_id, status, response=record, error=error.to_problem() if error else None, events=_rows(events)
    )


def _pause(conn: Any, task_id: str, reason: str, bytes_done: int) -> None:
    seq = event_log.last_event_seq(conn, task_id) + 1
    event = ev.download_event(seq, ev.PAUSED, task_id, reason=reason, bytes_done=bytes_done)
    task_store.requeue(conn, task_id, events=_rows([event]))
