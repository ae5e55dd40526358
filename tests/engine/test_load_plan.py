"""Load plans: where a model runs and what it costs, decided from its header before loading.

The GPU branch cannot run on this machine (no GPU), so its decisions are checked here as logic;
the CPU branch also runs for real in every integration test.
"""

from __future__ import annotations

from pathlib import Path

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry, Projector
from lmsp_tray.engine.load_plan import (
    COMPUTE_OVERHEAD_BYTES,
    GPU_RESERVE_BYTES,
    LoadOptions,
    auto_window,
    context_window,
    fit_projector,
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
    """Without context_cap: 32k where one such sequence fits (else 16k, where a coding agent's ~9,000-token
    first request still fits), more where four fit in half the budget, 8k on a machine that cannot hold 16k;
    never past the trained length."""
    per_token = 32 * 8 * 256 * 2  # 128 KiB: a 7B model's f16 KV cache per token
    assert auto_window(per_token, None) == auto_window(None, 10 * GB) == 8192
    assert auto_window(per_token, 1 * GB) == 8192  # 16k tokens would take 2 GiB
    assert auto_window(per_token, 3 * GB) == 16384
    assert auto_window(per_token, 4 * GB) == 32768  # one 32k sequence (4 GiB) fits: an agent's session has room
    assert auto_window(per_token, 16 * GB) == 32768
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
    free = GPU_RESERVE_BYTES + COMPUTE_OVERHEAD_BYTES + kv // 2 + 2 * GB  # half the weights, half the KV cache
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


def test_a_projector_that_does_not_fit_is_planned_out_and_the_text_model_loads() -> None:
    """Issue 25 item 5: the projector's weights and buffer count; where they do not fit in the budget but
    the text model does, the plan leaves the projector out (text only) and says why, rather than refusing."""
    vision = entry()
    vision.projector = Projector(Path("/mmproj-m.gguf"), 1 * GB, vision=True, audio=False)
    plan = plan_load(vision, LoadOptions(context_cap=4096, parallel=1), gpu_free_bytes=None, cores=4)
    assert plan.projector_bytes == GB * 5 // 4 and plan.projector_skipped is None
    text_only = plan.ram_bytes - plan.projector_bytes
    roomy = fit_projector(plan, plan.ram_bytes, None, where="the budget")
    assert roomy is plan  # it fits with its projector: loaded with it
    lean = fit_projector(plan, text_only + GB // 2, None, where="the memory budget for models (5.00 GB of memory)")
    assert lean.projector_bytes == 0 and lean.ram_bytes == text_only
    assert lean.projector_skipped is not None
    assert "its projector" in lean.projector_skipped and "5.00 GB of memory" in lean.projector_skipped
    assert "text only" in lean.projector_skipped
    assert fit_projector(plan, text_only - 1, None, where="the budget") is plan  # not even text: refused by the caller
