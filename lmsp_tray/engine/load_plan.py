"""Deciding how a model will be loaded, before loading it: device, layers, window, sequences, memory.

A `LoadPlan` is computed from the file's header and the settings alone, so
the model manager can check it against the memory budget (and evict idle
models, or answer `507 insufficient_memory`) before llama.cpp allocates
anything — and the loader then follows the same plan.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from lmsp_tray.discovery.entry import ModelEntry

MAX_DEFAULT_PARALLEL = 4
DEFAULT_WINDOW = 8192  # the window when nothing better is known (no KV facts in the header, no memory figure)
# What a coding agent wants (its first request alone is ~9,000 tokens of tools and instructions, and a session
# grows from there): the largest of these one sequence of which fits, where four of a roomy window do not.
AGENT_WINDOWS = (32768, 16384)
ROOMY_WINDOWS = (65536, 32768, 16384)  # larger windows, given where memory holds them comfortably
COMPUTE_OVERHEAD_BYTES = 64 * 1024 * 1024  # llama.cpp compute buffers, roughly, at batch 512 (on each device used)
GPU_RESERVE_BYTES = 512 * 1024 * 1024  # the margin left free on a GPU (the driver, a desktop, estimate errors)


@dataclass(frozen=True)
class LoadOptions:
    context_cap: int | None = None  # None: sized from the KV budget (`auto_window`)
    parallel: int | None = None  # None: from memory (up to 4)
    threads: int | None = None  # None: physical cores
    gpu: str = "auto"  # "auto" | "off"
    gpu_layers: int | None = None  # None: all that fit
    max_queue: int = 16
    batch_size: int = 512
    speculative: bool = True  # prompt-lookup drafts, verified in the batch (adaptive per sequence)
    prompt_cache_dir: str | None = None  # where sequence states are saved at unload/idle (None: not saved)
    prompt_cache_bytes: int = 0  # the folder's budget (least recently used files go first)
    kv_budget_bytes: int | None = None  # memory the KV caches of parallel sequences may take
    allocator: str = "auto"  # the model process's malloc: "auto" (jemalloc/tcmalloc if installed) | "system"


@dataclass(frozen=True)
class ModelLoad:
    """One model's own load settings (config.toml's ``[models."<id>"]``); each None keeps the
    service-wide one. The manager applies them when it next loads that model."""

    context: int | None = None  # the window cap (`LoadOptions.context_cap`) for this model
    parallel: int | None = None
    gpu_layers: int | None = None
    speculative: bool | None = None
    keep_alive: float | None = None  # seconds idle before unloading; math.inf: never; None: the default
    draft: str | None = None  # the id of a small model of the same vocabulary that drafts for it

    def options(self, base: LoadOptions) -> LoadOptions:
        """`base` with this model's settings in place of the service-wide ones."""
        own: dict[str, Any] = {
            "context_cap": self.context,
            "parallel": self.parallel,
            "gpu_layers": self.gpu_layers,
            "speculative": self.speculative,
        }
        return dataclasses.replace(base, **{k: v for k, v in own.items() if v is not None})

    def keep_alive_or(self, default: float | None) -> float | None:
        """This model's keep-alive in the manager's terms (None: never), else `default`."""
        if self.keep_alive is None:
            return default
        return None if math.isinf(self.keep_alive) else self.keep_alive


@dataclass(frozen=True)
class LoadPlan:
    context_length: int  # window per sequence
    parallel: int  # sequences decoded together
    gpu_layers: int  # 0: CPU only
    total_layers: int
    threads: int
    weights_bytes: int
    kv_bytes: int
    # The multimodal projector loaded beside it (its weights and, estimated, its compute buffer): on the
    # GPU with the model's layers when they are there (libmtmd follows the model), else in host memory.
    projector_bytes: int = 0
    # Why the model's projector is left out (it did not fit in memory, or libmtmd would not load it): the
    # model then takes text only. None: the projector loads (or there is none).
    projector_skipped: str | None = None
    # A draft model loaded beside it (`runner.draft_model`): its file, id, and its weights and KV cache for
    # `parallel` sequences of `context_length`, counted where the model runs. `draft_skipped`: why it
    # runs without the draft it names (missing, another vocabulary, no room).
    draft_path: str | None = None
    draft_id: str | None = None
    draft_bytes: int = 0
    draft_skipped: str | None = None

    @property
    def on_gpu(self) -> bool:
        return self.gpu_layers > 0

    @property
    def gpu_fraction(self) -> float:
        return min(1.0, self.gpu_layers / self.total_layers) if self.total_layers else (1.0 if self.on_gpu else 0.0)

    @property
    def gpu_weights_bytes(self) -> int:
        """The weights of the offloaded layers (each layer taken as an equal share of the file)."""
        return _gpu_share(self.weights_bytes, self.gpu_layers, self.total_layers)

    @property
    def gpu_kv_bytes(self) -> int:
        """The KV cache of the offloaded layers (llama.cpp keeps a layer's cache where the layer runs)."""
        return _gpu_kv(self.kv_bytes, self.gpu_layers, self.total_layers)

    @property
    def ram_bytes(self) -> int:
        """Host memory the model takes (weights and KV cache not offloaded, buffers)."""
        host = self.weights_bytes - self.gpu_weights_bytes + self.kv_bytes - self.gpu_kv_bytes + COMPUTE_OVERHEAD_BYTES
        return host + (0 if self.on_gpu else self.projector_bytes + self.draft_bytes)

    @property
    def vram_bytes(self) -> int:
        """GPU memory the model takes: its offloaded layers' weights and KV cache, and compute buffers."""
        on_gpu = gpu_bytes(self.weights_bytes, self.kv_bytes, self.total_layers, self.gpu_layers)
        return on_gpu + (self.projector_bytes + self.draft_bytes if self.on_gpu else 0)


def _gpu_share(weights: int, layers: int, total_layers: int) -> int:
    if layers <= 0 or total_layers <= 0:
        return 0
    return weights * min(layers, total_layers) // total_layers


def _gpu_kv(kv: int, layers: int, total_layers: int) -> int:
    """The KV cache of `layers` offloaded layers: the repeating layers have one each, the output layer (one
    of `total_layers`, the first llama.cpp offloads) none."""
    blocks = max(1, total_layers - 1)
    return kv * max(0, min(layers, total_layers) - 1) // blocks


def gpu_bytes(weights: int, kv: int, total_layers: int, layers: int) -> int:
    """What `layers` of `total_layers` offloaded take on the GPU (0 for none): their share of the weights and
    of the KV cache, and llama.cpp's compute buffers there."""
    if layers <= 0:
        return 0
    return _gpu_share(weights, layers, total_layers) + _gpu_kv(kv, layers, total_layers) + COMPUTE_OVERHEAD_BYTES


def auto_window(per_token: int | None, kv_budget: int | None) -> int:
    """The default window when no `context_cap` is set, from the memory the KV caches may take.

    The largest of `ROOMY_WINDOWS` whose cache for `MAX_DEFAULT_PARALLEL` sequences fills at most
    half the budget, or, where larger, the largest of `AGENT_WINDOWS` one sequence of which fits (then fewer run in
    parallel), so a coding agent gets 32k wherever the machine can hold it; else `DEFAULT_WINDOW`."""
    if not per_token or not kv_budget:
        return DEFAULT_WINDOW
    roomy = next((w for w in ROOMY_WINDOWS if per_token * w * MAX_DEFAULT_PARALLEL * 2 <= kv_budget), 0)
    agent = next((w for w in AGENT_WINDOWS if per_token * w <= kv_budget), 0)
    return max(roomy, agent) or DEFAULT_WINDOW


def context_window(entry: ModelEntry, cap: int | None, kv_budget: int | None = None) -> int:
    """The window the service uses: min(trained length, cap), the cap being `context_cap` when set,
    else sized from memory (`auto_window`)."""
    info = entry.info
    trained = info.context_length if info and info.context_length else None
    if cap is None:
        cap = auto_window(info.kv_bytes_per_token() if info else None, kv_budget)
    return max(16, min(trained or cap, cap))


def plan_load(entry: ModelEntry, options: LoadOptions, *, gpu_free_bytes: int | None, cores: int) -> LoadPlan:
    """How `entry` would be loaded with `options` (`gpu_free_bytes` None: no usable GPU; else what is free
    on it for this model: what the models loaded before took is not). `gpu = "off"` keeps it on the CPU,
    `gpu_layers` offloads that many layers whatever the memory."""
    info = entry.info
    total_layers = (info.block_count if info and info.block_count else 0) + 1
    context = context_window(entry, options.context_cap, options.kv_budget_bytes)
    per_token = info.kv_bytes_per_token() if info else None
    if options.parallel:
        parallel = max(1, options.parallel)
    elif per_token and options.kv_budget_bytes:
        parallel = int(max(1, min(MAX_DEFAULT_PARALLEL, options.kv_budget_bytes // (per_token * context))))
    else:
        parallel = MAX_DEFAULT_PARALLEL
    kv = (per_token or 0) * context * parallel
    gpu_layers = 0
    if options.gpu != "off" and gpu_free_bytes is not None:
        if options.gpu_layers is not None:
            gpu_layers = min(options.gpu_layers, total_layers)
        else:
            gpu_layers = _layers_that_fit(entry.size_bytes, kv, total_layers, gpu_free_bytes)
    projector = entry.projector.size_bytes * 5 // 4 if entry.projector is not None else 0  # weights + ~25% buffers
    return LoadPlan(
        context, parallel, gpu_layers, total_layers, options.threads or cores, entry.size_bytes, kv, projector
    )


def with_draft(plan: LoadPlan, draft: ModelEntry) -> LoadPlan:
    """`plan` with `draft` loaded beside the model: its weights and a KV cache as the model's (same window
    and sequences) counted."""
    info = draft.info
    per_token = info.kv_bytes_per_token() if info else None
    kv = (per_token or 0) * plan.context_length * plan.parallel
    return dataclasses.replace(
        plan, draft_path=str(draft.path), draft_id=draft.id, draft_bytes=draft.size_bytes + kv, draft_skipped=None
    )


def without_draft(plan: LoadPlan, reason: str) -> LoadPlan:
    """`plan` without its draft model (it runs with prompt lookup alone) for `reason`."""
    return dataclasses.replace(plan, draft_path=None, draft_bytes=0, draft_skipped=reason)


def fit_draft(plan: LoadPlan, ram_bytes: int | None, vram_bytes: int | None, *, where: str) -> LoadPlan:
    """`plan` when it fits with its draft model (or has none, or does not fit even without it: its
    caller refuses it), else the plan without the draft, saying why."""
    lean = without_draft(
        plan,
        f"the draft model '{plan.draft_id}' (about {plan.draft_bytes / 1e9:.2f} GB with its KV cache) did not fit "
        f"in {where} beside the model, so it runs without it",
    )
    return _shed(plan, plan.draft_bytes, lean, ram_bytes, vram_bytes)


def without_projector(plan: LoadPlan, reason: str) -> LoadPlan:
    """`plan` for the text model alone: its projector left out (it takes text only) for `reason`."""
    return dataclasses.replace(plan, projector_bytes=0, projector_skipped=reason)


def fits(plan: LoadPlan, ram_bytes: int | None, vram_bytes: int | None) -> bool:
    """Whether `plan` takes at most `ram_bytes` of memory and `vram_bytes` of GPU memory (None: no limit)."""
    return (ram_bytes is None or plan.ram_bytes <= ram_bytes) and (vram_bytes is None or plan.vram_bytes <= vram_bytes)


def fit_projector(plan: LoadPlan, ram_bytes: int | None, vram_bytes: int | None, *, where: str) -> LoadPlan:
    """`plan` when it fits in `ram_bytes` and `vram_bytes` (None: no limit) with its projector, or when even
    the text model alone does not (its caller refuses it); else the plan without the projector, saying why
    (`where`: the memory that was short, in words)."""
    lean = without_projector(
        plan,
        f"its projector (about {plan.projector_bytes / 1e9:.2f} GB with its compute buffer) did not fit "
        f"in {where} beside the model, so it was loaded without it and takes text only",
    )
    return _shed(plan, plan.projector_bytes, lean, ram_bytes, vram_bytes)


def _shed(plan: LoadPlan, part_bytes: int, lean: LoadPlan, ram_bytes: int | None, vram_bytes: int | None) -> LoadPlan:
    """`plan` when it has no such part (`part_bytes` 0) or fits with it, else `lean` (the plan without the
    part) when that fits, else `plan` (which its caller refuses)."""
    if not part_bytes or fits(plan, ram_bytes, vram_bytes):
        return plan
    return lean if fits(lean, ram_bytes, vram_bytes) else plan


def _layers_that_fit(weights: int, kv: int, total_layers: int, free: int) -> int:
    """All layers when they fit in `free` less the margin, else as many as fit (the rest run on the CPU),
    their KV cache and the compute buffers counted; 0 when not even one does."""
    room = free - GPU_RESERVE_BYTES
    return next((n for n in range(total_layers, 0, -1) if gpu_bytes(weights, kv, total_layers, n) <= room), 0)
