"""The set of loaded models: load on demand, evict to fit, unload on request or when idle.

`ModelManager` is the only owner of `LlamaModel` objects. Loads of one model
are de-duplicated (concurrent callers wait for the same load); states follow
PROFILE §3 (`available`, `loading`, `loaded`, `unloading`, `error`). Before a
load, its `LoadPlan` is checked against the budget (at most N models, a share
of RAM and of VRAM): least-recently-used idle models are unloaded to make
room, a model with work in progress never is, and a load that cannot fit gets
`507 insufficient_memory` saying what it needs and what is free. A reaper
thread unloads models idle longer than their keep-alive. Listeners hear about
every state change (the tray redraws from them).

How a model is loaded is the `ModelFactory`'s business: the service runs each
model in a process of its own (`process.ModelProcess`), so when one dies the
factory's exit callback lands here and the model becomes `error` with the
reason (`model_crashed`); the next `acquire` loads it again. Tests inject a
factory of fakes to check the bookkeeping fast (eviction, keep-alive, 429,
507) and keep the real-llama.cpp tests for the models themselves.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.load_plan import LoadOptions, LoadPlan, context_window, plan_load
from lmsp_tray.engine.loaded import LoadedModel
from lmsp_tray.engine.prompt_cache import folder_bytes, model_folder
from lmsp_tray.engine.runtime import Runtime, physical_cores
from lmsp_tray.errors import InsufficientMemory, LMSPError, ModelLoadFailed, ServiceUnavailable

log = logging.getLogger("lmsp_tray.engine")

AVAILABLE, LOADING, LOADED, UNLOADING, ERROR = "available", "loading", "loaded", "unloading", "error"
DEFAULT = "default"  # keep-alive sentinel: the configured default


@dataclass(frozen=True)
class MemoryBudget:
    """What loaded models may use together."""

    max_models: int = 3
    ram_bytes: int | None = None  # None: unlimited
    vram_bytes: int | None = None


ExitCallback = Callable[[LoadedModel, LMSPError], None]


class ModelFactory(Protocol):
    """Loads a model following `plan`; calls `on_exit(model, error)` if the loaded model later dies and
    `on_progress(share)` (0..1) while it reads the weights."""

    def __call__(
        self,
        entry: ModelEntry,
        options: LoadOptions,
        plan: LoadPlan,
        on_exit: ExitCallback,
        on_progress: Callable[[float], None] | None = None,
    ) -> LoadedModel: ...  # pragma: no cover


def process_factory(
    entry: ModelEntry,
    options: LoadOptions,
    plan: LoadPlan,
    on_exit: ExitCallback,
    on_progress: Callable[[float], None] | None = None,
) -> LoadedModel:
    """Each model in a process of its own (the service's default)."""
    from lmsp_tray.engine.process import ModelProcess

    return ModelProcess(entry, options, plan, on_exit=on_exit, on_progress=on_progress)


def in_process_factory(runtime: Runtime) -> ModelFactory:
    """Models in this process (tests and benchmarks that look inside the scheduler)."""

    def load(
        entry: ModelEntry,
        options: LoadOptions,
        plan: LoadPlan,
        on_exit: ExitCallback,
        on_progress: Callable[[float], None] | None = None,
    ) -> LoadedModel:
        from lmsp_tray.engine.model import LlamaModel

        return LlamaModel(runtime, entry, options, plan, on_load_progress=on_progress)

    return load


def gpu_free(runtime: Runtime | None) -> int | None:
    """Free memory on the GPUs llama.cpp sees, or None when there is no usable GPU."""
    if runtime is None or not runtime.has_gpu:
        return None
    return sum(d.free_bytes for d in runtime.devices)


@dataclass
class _Record:
    state: str = AVAILABLE
    model: LoadedModel | None = None
    plan: LoadPlan | None = None
    error: LMSPError | None = None
    keep_alive: float | None = None  # seconds idle before unloading; None: never
    last_used: float = field(default_factory=time.monotonic)
    progress: float | None = None  # while loading: the share of the weights read (0..1)

    @property
    def busy(self) -> bool:
        return self.state != LOADED or (self.model is not None and self.model.busy)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


class ModelManager:
    def __init__(
        self,
        runtime: Runtime | None,
        options: LoadOptions,
        *,
        budget: MemoryBudget | None = None,
        keep_alive: float | None = 300.0,
        reap_interval: float = 1.0,
        factory: ModelFactory = process_factory,
        cores: int | None = None,
    ) -> None:
        """`runtime` tells free GPU memory for load plans (None: plan for the CPU)."""
        self._runtime = runtime
        self._factory = factory
        self._cores = cores or physical_cores()
        self._options = options
        self._budget = budget or MemoryBudget()
        self._default_keep_alive = keep_alive
        self._records: dict[str, _Record] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified on every state change
        self._listeners: list[Callable[[str, str], None]] = []
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, args=(reap_interval,), name="lmsp-reaper", daemon=True)
        self._reaper.start()

    # -- observation ----------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[str, str], None]) -> None:
        """`listener(model_id, state)` is called after every state change."""
        self._listeners.append(listener)

    def _set(self, model_id: str, record: _Record, state: str) -> None:
        record.state = state
        self._changed.notify_all()
        for listener in list(self._listeners):
            try:
                listener(model_id, state)
            except Exception:  # a broken listener must not break loading
                log.exception("model state listener failed")

    def state(self, model_id: str) -> tuple[str, LMSPError | None]:
        with self._lock:
            record = self._records.get(model_id)
            return (record.state, record.error) if record else (AVAILABLE, None)

    def load_progress(self, model_id: str) -> float | None:
        """While `model_id` loads, the share of its weights read so far (0..1); else None."""
        with self._lock:
            record = self._records.get(model_id)
            return record.progress if record is not None and record.state == LOADING else None

    def get(self, model_id: str) -> LoadedModel | None:
        with self._lock:
            record = self._records.get(model_id)
            return record.model if record and record.state == LOADED else None

    def use_if_loaded(self, model_id: str, *, keep_alive: float | None | str = DEFAULT) -> LoadedModel | None:
        """The model if it is loaded right now (marking it used), else None; never blocks on a load."""
        with self._lock:
            record = self._records.get(model_id)
            if record is None or record.state != LOADED or record.model is None:
                return None
            self._touch(record, keep_alive)
            return record.model

    def loaded(self) -> list[LoadedModel]:
        with self._lock:
            return [r.model for r in self._records.values() if r.state == LOADED and r.model is not None]

    def context_window(self, entry: ModelEntry) -> int:
        """The window `entry` gets when loaded with the current settings (without asking the GPU)."""
        return context_window(entry, self._options.context_cap, self._options.kv_budget_bytes)

    def plan(self, entry: ModelEntry) -> LoadPlan:
        return plan_load(entry, self._options, gpu_free_bytes=gpu_free(self._runtime), cores=self._cores)

    def reconfigure(
        self, options: LoadOptions, budget: MemoryBudget, *, keep_alive: float | None | str = DEFAULT
    ) -> None:
        """Settings changed: loads from now on follow `options` and `budget`; a new default
        `keep_alive` (seconds, None: never) also applies to the models loaded now."""
        with self._lock:
            self._options = options
            self._budget = budget
            if keep_alive != DEFAULT:
                self._default_keep_alive = keep_alive  # type: ignore[assignment]
                for record in self._records.values():
                    record.keep_alive = keep_alive  # type: ignore[assignment]

    # -- loading --------------------------------------------------------------------------------
    def _settled(self, model_id: str, waited: _Record) -> bool:
        """Whether the load or unload of `waited` is over (or its record was replaced); under the lock."""
        return self._records.get(model_id) is not waited or waited.state not in (LOADING, UNLOADING)

    def acquire(self, entry: ModelEntry, *, keep_alive: float | None | str = DEFAULT) -> LoadedModel:
        """The loaded model for `entry`, loading it first if needed (blocking)."""
        while True:
            with self._lock:
                if self._closed.is_set():
                    raise ServiceUnavailable("The service is shutting down.")
                record = self._records.get(entry.id)
                if record is not None and record.state in (LOADING, UNLOADING):
                    # Someone else is loading or unloading it: wait for the outcome, then decide again.
                    self._changed.wait_for(functools.partial(self._settled, entry.id, record))
                    if self._records.get(entry.id) is record and record.state == ERROR and record.error:
                        raise record.error
                    continue
                if record is not None and record.state == LOADED and record.model is not None:
                    self._touch(record, keep_alive)
                    return record.model
                if not entry.ok:
                    raise ModelLoadFailed(f"'{entry.id}' cannot be loaded: {entry.error or 'unreadable file'}")
                plan = self.plan(entry)
                victims = self._make_room(entry.id, plan)
                record = _Record(plan=plan, keep_alive=self._default_keep_alive)
                self._records[entry.id] = record
                self._set(entry.id, record, LOADING)
            for victim in victims:
                log.info("unloading %s to make room for %s", victim, entry.id)
                self.unload(victim, drain=True)
            return self._do_load(entry, record, keep_alive)

    def _make_room(self, model_id: str, plan: LoadPlan) -> list[str]:
        """Idle models to unload (least recently used first) so `plan` fits; 507 when it cannot."""
        budget = self._budget
        for need, limit, kind in (
            (plan.ram_bytes, budget.ram_bytes, "memory"),
            (plan.vram_bytes, budget.vram_bytes, "GPU memory"),
        ):
            if limit is not None and need > limit:
                raise InsufficientMemory(
                    f"'{model_id}' needs about {_gb(need)} of {kind} (weights and a {plan.context_length}-token "
                    f"context for {plan.parallel} sequence(s)); the budget for models is {_gb(limit)}. Lower "
                    f"context_cap or parallel, or raise memory_budget_fraction in config.toml.",
                    extra={"required_bytes": need, "available_bytes": limit},
                )
        others = [
            (mid, r, r.plan) for mid, r in self._records.items() if r.state in (LOADING, LOADED) and r.plan is not None
        ]
        ram = sum(p.ram_bytes for _, _, p in others)
        vram = sum(p.vram_bytes for _, _, p in others)
        count = len(others)
        evictable = sorted(((r.last_used, mid, p) for mid, r, p in others if not r.busy), key=lambda t: (t[0], t[1]))
        victims: list[str] = []

        def fits() -> bool:
            return (
                count < budget.max_models
                and (budget.ram_bytes is None or ram + plan.ram_bytes <= budget.ram_bytes)
                and (budget.vram_bytes is None or vram + plan.vram_bytes <= budget.vram_bytes)
            )

        while not fits() and evictable:
            _, mid, victim_plan = evictable.pop(0)
            victims.append(mid)
            ram -= victim_plan.ram_bytes
            vram -= victim_plan.vram_bytes
            count -= 1
        if not fits():
            free = max(0, (budget.ram_bytes or 0) - ram)
            raise InsufficientMemory(
                f"'{model_id}' needs about {_gb(plan.ram_bytes)} of memory but only {_gb(free)} of the model "
                f"budget is free and every loaded model ({count}, at most {budget.max_models}) is busy. "
                f"Retry when a request finishes, or unload a model.",
                extra={"required_bytes": plan.ram_bytes, "available_bytes": free},
                headers={"Retry-After": "5"},
            )
        return victims

    def _touch(self, record: _Record, keep_alive: float | None | str) -> None:
        record.last_used = time.monotonic()
        if keep_alive != DEFAULT:
            record.keep_alive = keep_alive  # type: ignore[assignment]

    def _do_load(self, entry: ModelEntry, record: _Record, keep_alive: float | None | str) -> LoadedModel:
        assert record.plan is not None
        try:
            record.progress = 0.0

            def progress(share: float) -> None:
                record.progress = min(max(share, 0.0), 1.0)  # one float: read under the lock, set without

            model = self._factory(entry, self._options, record.plan, self._model_exited, progress)
        except LMSPError as exc:
            with self._lock:
                record.error = exc
                self._set(entry.id, record, ERROR)
            raise
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                record.model = model
                record.error = None
                self._touch(record, keep_alive)
                self._set(entry.id, record, LOADED)
        if closed:  # the service stopped while this model was loading
            model.close()
            raise ServiceUnavailable("The service is shutting down.")
        return model

    def _model_exited(self, model: LoadedModel, error: LMSPError) -> None:
        """A loaded model died on its own (its process crashed): `error` until the next load."""
        with self._lock:
            record = self._records.get(model.id)
            if record is None or record.model is not model:
                return  # already unloaded or replaced
            record.model = None
            record.error = error
            self._set(model.id, record, ERROR)
        threading.Thread(target=model.close, name="lmsp-reap-crashed", daemon=True).start()

    def prompt_cache_bytes(self, entry: ModelEntry) -> int | None:
        """What `entry`'s saved sequence states take on disk (None: the prompt cache is off)."""
        root = self._options.prompt_cache_dir
        if not root or self._options.prompt_cache_bytes <= 0:
            return None
        return folder_bytes(model_folder(Path(root), entry.path))

    def unload(self, model_id: str, *, drain: bool = True) -> bool:
        """Unload a model; with `drain`, its running and queued requests finish first."""
        with self._lock:
            record = self._records.get(model_id)
            if record is None or record.state != LOADED or record.model is None:
                if record is not None and record.state == ERROR:
                    del self._records[model_id]
                    self._set(model_id, _Record(), AVAILABLE)
                return False
            model = record.model
            self._set(model_id, record, UNLOADING)
        model.close(drain=drain)
        with self._lock:
            if self._records.get(model_id) is record:
                del self._records[model_id]
            self._set(model_id, _Record(), AVAILABLE)
        return True

    def unload_all(self, *, drain: bool = True) -> None:
        for model in self.loaded():
            self.unload(model.id, drain=drain)

    # -- idle unloading -------------------------------------------------------------------------
    def _reap(self, interval: float) -> None:
        while not self._closed.wait(interval):
            now = time.monotonic()
            idle: list[str] = []
            with self._lock:
                for model_id, record in self._records.items():
                    model = record.model
                    if record.state != LOADED or model is None or record.keep_alive is None:
                        continue
                    if model.busy:
                        record.last_used = now
                        continue
                    last = max(record.last_used, model.last_activity)
                    if now - last >= record.keep_alive:
                        idle.append(model_id)
            for model_id in idle:
                log.info("unloading %s after its keep-alive", model_id)
                self.unload(model_id, drain=True)

    def close(self) -> None:
        """Unload everything at once (running jobs end 503) and stop the reaper; waits for the model
        processes to end. Safe to call again."""
        self._closed.set()
        self.unload_all(drain=False)
        if self._reaper is not threading.current_thread():
            self._reaper.join(5.0)
