"""The set of loaded models: load on demand, evict to fit, unload on request or when idle.

`ModelManager` is the only owner of loaded models. Loads of one model
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.cache_folders import folder_bytes, model_folder
from lmsp_tray.engine.devices import Devices, physical_cores
from lmsp_tray.engine.drafts import DraftRefused, check_draft
from lmsp_tray.engine.load_plan import (
    LoadOptions,
    LoadPlan,
    ModelLoad,
    context_window,
    fit_draft,
    fit_projector,
    plan_load,
    with_draft,
    without_draft,
)
from lmsp_tray.engine.loaded import LoadedModel
from lmsp_tray.errors import InsufficientMemory, LMSPError, ModelLoadFailed, ServiceUnavailable
from lmsp_tray.protocol.keep_alive import DEFAULT, KeepAlive
from lmsp_tray.protocol.states import ModelState

log = logging.getLogger("lmsp_tray.engine")

AVAILABLE, LOADING, LOADED = ModelState.AVAILABLE, ModelState.LOADING, ModelState.LOADED
UNLOADING, ERROR = ModelState.UNLOADING, ModelState.ERROR


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


def gpu_free(devices: Devices | None) -> int | None:
    """Free memory on the GPUs llama.cpp sees, or None when there is no usable GPU."""
    return None if devices is None else devices.gpu_free_bytes


@dataclass
class _Record:
    state: ModelState = AVAILABLE
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
        devices: Devices | None,
        options: LoadOptions,
        *,
        budget: MemoryBudget | None = None,
        keep_alive: float | None = 300.0,
        reap_interval: float = 1.0,
        factory: ModelFactory = process_factory,
        cores: int | None = None,
        per_model: Mapping[str, ModelLoad] | None = None,
        find: Callable[[str], ModelEntry | None] | None = None,
    ) -> None:
        """`devices` tells free GPU memory for load plans (None: plan for the CPU); `per_model`: models'
        own load settings by id (applied at their next load); `find`: a model entry by id (the catalog's),
        for the draft models those settings name."""
        self._devices = devices
        self._find = find
        self._factory = factory
        self._cores = cores or physical_cores()
        self._options = options
        self._budget = budget or MemoryBudget()
        self._default_keep_alive = keep_alive
        self._per_model: Mapping[str, ModelLoad] = dict(per_model or {})
        self._records: dict[str, _Record] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified on every state change
        self._listeners: list[Callable[[str, ModelState], None]] = []
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, args=(reap_interval,), name="lmsp-reaper", daemon=True)
        self._reaper.start()

    # -- observation ----------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[str, ModelState], None]) -> None:
        """`listener(model_id, state)` is called after every state change."""
        self._listeners.append(listener)

    def _set(self, model_id: str, record: _Record, state: ModelState) -> None:
        record.state = state
        self._changed.notify_all()
        for listener in list(self._listeners):
            try:
                listener(model_id, state)
            except Exception:  # a broken listener must not break loading
                log.exception("model state listener failed")

    def state(self, model_id: str) -> tuple[ModelState, LMSPError | None]:
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

    def use_if_loaded(self, model_id: str, *, keep_alive: KeepAlive = DEFAULT) -> LoadedModel | None:
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

    def unloads_in(self, model_id: str) -> float | None:
        """Seconds until a loaded model is unloaded for being idle (its keep-alive counted from its last
        use; a busy model's from now); None when it stays loaded (keep-alive "never", or not loaded)."""
        with self._lock:
            record = self._records.get(model_id)
            model = record.model if record is not None else None
            if record is None or record.state != LOADED or model is None or record.keep_alive is None:
                return None
            now = time.monotonic()
            last = now if model.busy else max(record.last_used, model.last_activity)
            return max(0.0, last + record.keep_alive - now)

    def context_window(self, entry: ModelEntry) -> int:
        """The window `entry` gets when loaded with the current settings (without asking the GPU)."""
        options = self.options_for(entry.id)
        return context_window(entry, options.context_cap, options.kv_budget_bytes)

    def options_for(self, model_id: str) -> LoadOptions:
        """How `model_id` loads next: the service-wide options with its own settings in their place."""
        own = self._per_model.get(model_id)
        return self._options if own is None else own.options(self._options)

    def _keep_alive_for(self, model_id: str) -> float | None:
        own = self._per_model.get(model_id)
        return self._default_keep_alive if own is None else own.keep_alive_or(self._default_keep_alive)

    @property
    def devices(self) -> Devices | None:
        """What llama.cpp sees, as probed at start-up (None: not known; the CPU is planned for)."""
        return self._devices

    def plan(self, entry: ModelEntry) -> LoadPlan:
        """How `entry` would load now: against the GPU memory free at start-up less what the models loaded
        (or loading) since take there, so a second model on one GPU gets what the first left."""
        free = gpu_free(self._devices)
        if free is not None:
            with self._lock:
                taken = sum(
                    r.plan.vram_bytes
                    for mid, r in self._records.items()
                    if mid != entry.id and r.state in (LOADING, LOADED, UNLOADING) and r.plan is not None
                )
            free = max(0, free - taken)
        options = self.options_for(entry.id)
        plan = plan_load(entry, options, gpu_free_bytes=free, cores=self._cores)
        own = self._per_model.get(entry.id)
        if own is None or not own.draft:
            return plan
        if not options.speculative:
            return without_draft(plan, f"the draft model '{own.draft}' was not used: speculative decoding is off")
        try:
            draft = check_draft(entry, own.draft, self._find(own.draft) if self._find is not None else None)
        except DraftRefused as exc:
            log.warning("%s: %s; it loads without it", entry.id, exc.reason)
            return without_draft(plan, exc.reason)
        return with_draft(plan, draft)

    def reconfigure(
        self,
        options: LoadOptions,
        budget: MemoryBudget,
        *,
        keep_alive: KeepAlive = DEFAULT,
        per_model: Mapping[str, ModelLoad] | None = None,
    ) -> None:
        """Settings changed: loads from now on follow `options` and `budget` (and, given, `per_model`:
        each model's own settings, from its next load); a new default `keep_alive` (seconds, None: never)
        also applies to the models loaded now that have none of their own."""
        with self._lock:
            self._options = options
            self._budget = budget
            if per_model is not None:
                self._per_model = dict(per_model)
            if keep_alive is not DEFAULT:
                self._default_keep_alive = keep_alive
                for model_id, record in self._records.items():
                    own = self._per_model.get(model_id)
                    if own is None or own.keep_alive is None:
                        record.keep_alive = keep_alive

    # -- loading --------------------------------------------------------------------------------
    def _settled(self, model_id: str, waited: _Record) -> bool:
        """Whether the load or unload of `waited` is over (or its record was replaced); under the lock."""
        return self._records.get(model_id) is not waited or waited.state not in (LOADING, UNLOADING)

    def acquire(self, entry: ModelEntry, *, keep_alive: KeepAlive = DEFAULT) -> LoadedModel:
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
                plan = self._within_budget(self.plan(entry))
                victims = self._make_room(entry.id, plan)
                record = _Record(plan=plan, keep_alive=self._keep_alive_for(entry.id))
                self._records[entry.id] = record
                self._set(entry.id, record, LOADING)
            for victim in victims:
                log.info("unloading %s to make room for %s", victim, entry.id)
                self.unload(victim, drain=True)
            return self._do_load(entry, record, keep_alive)

    def _within_budget(self, plan: LoadPlan) -> LoadPlan:
        """`plan`, or, when the budget cannot hold it with the model's projector but can without, the plan
        for the text model alone (loaded for text only, saying why) rather than a refusal. Only the whole
        budget counts: memory that busy models hold now is given back, so that 507 is worth a retry."""
        budget = self._budget
        limits = [
            f"{_gb(n)} of {kind}" for n, kind in ((budget.ram_bytes, "memory"), (budget.vram_bytes, "GPU memory")) if n
        ]
        where = f"the memory budget for models ({', '.join(limits)})"
        lean = fit_draft(plan, budget.ram_bytes, budget.vram_bytes, where=where)
        if lean is not plan:
            log.warning("%s", lean.draft_skipped)
        plan = lean
        return fit_projector(plan, budget.ram_bytes, budget.vram_bytes, where=where)

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

    def _touch(self, record: _Record, keep_alive: KeepAlive) -> None:
        record.last_used = time.monotonic()
        if keep_alive is not DEFAULT:
            record.keep_alive = keep_alive

    def _do_load(self, entry: ModelEntry, record: _Record, keep_alive: KeepAlive) -> LoadedModel:
        assert record.plan is not None
        try:
            record.progress = 0.0

            def progress(share: float) -> None:
                record.progress = min(max(share, 0.0), 1.0)  # one float: read under the lock, set without

            model = self._factory(entry, self.options_for(entry.id), record.plan, self._model_exited, progress)
        except LMSPError as exc:
            with self._lock:
                record.error = exc
                self._set(entry.id, record, ERROR)
            raise
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                record.model = model
                record.plan = model.plan  # as loaded: fewer GPU layers when the GPU ran out of memory
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
