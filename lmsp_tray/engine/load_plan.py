"""Deciding how a model will be loaded, before loading it: device, layers, window, sequences, memory.

A `LoadPlan` is computed from the file's header and the settings alone, so
the model manager can check it against the memory budget (and evict idle
models, or answer `507 insufficient_memory`) before llama.cpp allocates
anything — and the loader then follows the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmsp_tray.discovery.entry import ModelEntry

MAX_DEFAULT_PARALLEL = 4
DEFAULT_WINDOW = 8192  # the window when nothing better is known (no KV facts in the header, no memory figure)
AGENT_WINDOW = 16384  # what a coding agent's first request needs (~9,000 tokens of tools and instructions)
ROOMY_WINDOWS = (65536, 32768, 16384)  # larger windows, given where memory holds them comfortably
COMPUTE_OVERHEAD_BYTES = 64 * 1024 * 1024  # llama.cpp compute buffers, roughly, at batch 512
GPU_RESERVE_BYTES = 512 * 1024 * 1024


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
class LoadPlan:
    context_length: int  # window per sequence
    parallel: int  # sequences decoded together
    gpu_layers: int  # 0: CPU only
    total_layers: int
    threads: int
    weights_bytes: int
    kv_bytes: int

    @property
    def on_gpu(self) -> bool:
        return self.gpu_layers > 0

    @property
    def gpu_fraction(self) -> float:
        return min(1.0, self.gpu_layers / self.total_layers) if self.total_layers else (1.0 if self.on_gpu else 0.0)

    @property
    def ram_bytes(self) -> int:
        """Host memory the model takes (weights not offloaded, KV when on the CPU, buffers)."""
        weights = int(self.weights_bytes * (1.0 - self.gpu_fraction))
        kv = 0 if self.on_gpu else self.kv_bytes
        return weights + kv + COMPUTE_OVERHEAD_BYTES

    @property
    def vram_bytes(self) -> int:
        if not self.on_gpu:
            return 0
        return int(self.weights_bytes * self.gpu_fraction) + self.kv_bytes + COMPUTE_OVERHEAD_BYTES


def auto_window(per_token: int | None, kv_budget: int | None) -> int:
    """The default window when no `context_cap` is set, from the memory the KV caches may take.

    The largest of `ROOMY_WINDOWS` whose cache for `MAX_DEFAULT_PARALLEL` sequences fills at most
    half the budget; else `AGENT_WINDOW` when one sequence of it fits (then fewer run in parallel),
    so a coding agent's first request fits wherever the machine can hold it; else `DEFAULT_WINDOW`."""
    if not per_token or not kv_budget:
        return DEFAULT_WINDOW
    for window in ROOMY_WINDOWS:
        if per_token * window * MAX_DEFAULT_PARALLEL * 2 <= kv_budget:
            return window
    return AGENT_WINDOW if per_token * AGENT_WINDOW <= kv_budget else DEFAULT_WINDOW


def context_window(entry: ModelEntry, cap: int | None, kv_budget: int | None = None) -> int:
    """The window the service uses: min(trained length, cap), the cap being `context_cap` when set,
    else sized from memory (`auto_window`)."""
    info = entry.info
    trained = info.context_length if info and info.context_length else None
    if cap is None:
        cap = auto_window(info.kv_bytes_per_token() if info else None, kv_budget)
    return max(16, min(trained or cap, cap))


def plan_load(entry: ModelEntry, options: LoadOptions, *, gpu_free_bytes: int | None, cores: int) -> LoadPlan:
    """How `entry` would be loaded with `options` (`gpu_free_bytes` None: no usable GPU)."""
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
    return LoadPlan(context, parallel, gpu_layers, total_layers, options.threads or cores, entry.size_bytes, kv)


def _layers_that_fit(weights: int, kv: int, total_layers: int, free: int) -> int:
    usable = free - GPU_RESERVE_BYTES - kv
    if usable >= weights:
        return total_layers
    if usable <= 0 or total_layers <= 1:
        return 0
    return max(0, min(total_layers, int(total_layers * usable / max(weights, 1))))
