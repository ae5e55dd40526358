"""Load plans: where a model runs and what it costs, decided from its header before loading.

The GPU branch cannot run on this machine (no GPU), so its decisions are checked here as logic;
the CPU branch also runs for real in every integration test.
"""

from __future__ import annotations

from pathlib import Path

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.load_plan import (
    COMPUTE_OVERHEAD_BYTES,
    GPU_RESERVE_BYTES,
    LoadOptions,
    auto_window,
    context_window,
    plan_load,
)

GB = 1024**3


def entry(size: int = 4 * GB, ctx: int | None = 32768) -> ModelEntry:
    info = GGUFInfo(
        architecture="llama", context_length=ctx, block_count=32, embedding_length=4096, head_count=32, head_count_kv=8
    )
    return ModelEntry("m:7b-q4_k_m", Path("/m.gguf"), "custom", size, info=info)


def test_context_window_is_min_of_trained_and_cap() -> None:
    assert context_window(entry(ctx=32768), 8192) == 8192
    assert context_window(entry(ctx=4096), 8192) == 4096
    assert context_window(entry(ctx=None), 8192) == 8192


def test_default_window_is_sized_from_memory() -> None:
    """Without context_cap: 16k where one such sequence fits (a coding agent's ~9,000-token first request
    fits), more where four fit in half the budget, 8k on a machine that cannot hold 16k; never past the
    trained length."""
    per_token = 32 * 8 * 256 * 2  # 128 KiB: a 7B model's f16 KV cache per token
    assert auto_window(per_token, None) == auto_window(None, 10 * GB) == 8192
    assert auto_window(per_token, 1 * GB) == 8192  # 16k tokens would take 2 GiB
    assert auto_window(per_token, 3 * GB) == 16384
    assert auto_window(per_token, 16 * GB) == 16384
    assert auto_window(per_token, 32 * GB) == 32768
    assert auto_window(per_token, 64 * GB) == 65536
    assert context_window(entry(ctx=32768), None, 64 * GB) == 32768  # the trained length bounds it
    assert context_window(entry(ctx=4096), None, 64 * GB) == 4096
    assert context_window(entry(ctx=32768), 8192, 64 * GB) == 8192  # an explicit cap wins
    plan = plan_load(entry(), LoadOptions(kv_budget_bytes=3 * GB), gpu_free_bytes=None, cores=2)
    assert plan.context_length == 16384 and plan.parallel == 1  # the window first, then what runs beside it
    assert plan_load(entry(), LoadOptions(kv_budget_bytes=16 * GB), gpu_free_bytes=None, cores=2).parallel == 4


def test_cpu_without_a_gpu() -> None:
    plan = plan_load(entry(), LoadOptions(), gpu_free_bytes=None, cores=6)
    assert plan.gpu_layers == 0 and not plan.on_gpu and plan.threads == 6
    assert plan.vram_bytes == 0
    per_token = 32 * 8 * (128 + 128) * 2
    assert plan.kv_bytes == per_token * 8192 * plan.parallel
    assert plan.ram_bytes == 4 * GB + plan.kv_bytes + COMPUTE_OVERHEAD_BYTES


def test_all_layers_on_a_gpu_with_room() -> None:
    plan = plan_load(entry(), LoadOptions(parallel=1), gpu_free_bytes=24 * GB, cores=8)
    assert plan.gpu_layers == plan.total_layers == 33 and plan.on_gpu
    assert plan.ram_bytes == COMPUTE_OVERHEAD_BYTES  # weights and KV live on the GPU
    assert plan.vram_bytes == 4 * GB + plan.kv_bytes + COMPUTE_OVERHEAD_BYTES


def test_partial_offload_when_the_gpu_is_small() -> None:
    opts = LoadOptions(parallel=1)
    kv = plan_load(entry(), opts, gpu_free_bytes=None, cores=8).kv_bytes
    free = GPU_RESERVE_BYTES + kv + 2 * GB  # room for half the weights
    plan = plan_load(entry(), opts, gpu_free_bytes=free, cores=8)
    assert 0 < plan.gpu_layers < plan.total_layers
    assert abs(plan.gpu_layers - plan.total_layers // 2) <= 1
    assert plan.ram_bytes > 1.5 * GB  # the rest of the weights stay in RAM


def test_gpu_off_and_explicit_layers() -> None:
    assert plan_load(entry(), LoadOptions(gpu="off"), gpu_free_bytes=24 * GB, cores=8).gpu_layers == 0
    assert plan_load(entry(), LoadOptions(gpu_layers=10), gpu_free_bytes=24 * GB, cores=8).gpu_layers == 10
    assert plan_load(entry(), LoadOptions(gpu_layers=999), gpu_free_bytes=24 * GB, cores=8).gpu_layers == 33


def test_parallel_sequences_follow_the_kv_budget() -> None:
    per_seq = 32 * 8 * 256 * 2 * 8192  # bytes of KV one 8k sequence takes
    for budget, parallel in ((per_seq * 10, 4), (per_seq * 2, 2), (per_seq // 2, 1)):
        options = LoadOptions(context_cap=8192, kv_budget_bytes=budget)
        assert plan_load(entry(), options, gpu_free_bytes=None, cores=2).parallel == parallel
    assert plan_load(entry(), LoadOptions(parallel=6), gpu_free_bytes=None, cores=2).parallel == 6
