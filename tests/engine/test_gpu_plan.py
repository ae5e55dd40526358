"""The planner's layer split against the GPU memory the device probe reports, on generated models.

Each model is a real generated GGUF (its size and header read as discovery reads them); the device is a
`Devices` with a given free memory, as the probe would give it. Layers go to the GPU when they all fit
with the margin (`GPU_RESERVE_BYTES`), else as many as fit with their KV cache and the compute buffers,
else none; `gpu = "off"` and `gpu_layers` override; a second model is planned against what the first took.
"""

from __future__ import annotations

import pytest
from fake_models import Factory
from gguf_factory import write_tiny_gguf

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.devices import DeviceInfo, Devices
from lmsp_tray.engine.load_plan import (
    COMPUTE_OVERHEAD_BYTES,
    GPU_RESERVE_BYTES,
    LoadOptions,
    LoadPlan,
    gpu_bytes,
    plan_load,
)
from lmsp_tray.engine.manager import MemoryBudget, ModelManager

OPTIONS = LoadOptions(parallel=1, threads=1, context_cap=4096)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[ModelEntry]:
    folder = tmp_path_factory.mktemp("gpu-plan")
    found = []
    for name, blocks in (("first", 4), ("second", 6)):
        path = write_tiny_gguf(
            folder / f"{name}.gguf", basename=name, context_length=4096, embedding=256, blocks=blocks, ffn=1024
        )
        found.append(ModelEntry(f"{name}:4m", path, "custom", path.stat().st_size, (), read_gguf_info(path)))
    return found


def devices(free: int) -> Devices:
    gpu = DeviceInfo("Vulkan0", "a test GPU", "gpu", "vulkan", total_bytes=free + (1 << 30), free_bytes=free)
    cpu = DeviceInfo("CPU", "the CPU", "cpu", "cpu", total_bytes=16 << 30, free_bytes=8 << 30)
    return Devices(backend="vulkan", gpu_offload=True, devices=(cpu, gpu))


def whole(entry: ModelEntry) -> int:
    """What `entry` takes on the GPU with every layer there."""
    return plan_load(entry, OPTIONS, gpu_free_bytes=1 << 40, cores=1).vram_bytes


def plan(entry: ModelEntry, free: int, options: LoadOptions = OPTIONS) -> LoadPlan:
    return ModelManager(devices(free), options, factory=Factory(), cores=1, reap_interval=3600).plan(entry)


def test_every_layer_on_the_gpu_when_the_model_fits_with_the_margin(models: list[ModelEntry]) -> None:
    first = models[0]
    assert first.size_bytes > 4 << 20 and first.info is not None and first.info.block_count == 4
    p = plan(first, GPU_RESERVE_BYTES + whole(first))
    assert p.gpu_layers == p.total_layers == 5
    assert p.vram_bytes == first.size_bytes + p.kv_bytes + COMPUTE_OVERHEAD_BYTES  # weights, KV and buffers
    assert p.ram_bytes == COMPUTE_OVERHEAD_BYTES
    assert plan(first, GPU_RESERVE_BYTES + whole(first) - 1).gpu_layers < 5  # the margin is kept


def test_as_many_layers_as_fit_and_the_rest_on_the_cpu(models: list[ModelEntry]) -> None:
    first = models[0]
    room = gpu_bytes(first.size_bytes, whole(first) - first.size_bytes - COMPUTE_OVERHEAD_BYTES, 5, 3)
    p = plan(first, GPU_RESERVE_BYTES + room + 1000)
    assert p.gpu_layers == 3 and p.total_layers == 5
    assert p.vram_bytes <= room + 1000  # KV cache and compute buffers counted with the 3 layers' weights
    assert gpu_bytes(p.weights_bytes, p.kv_bytes, 5, 4) > room + 1000  # a fourth would not fit
    assert p.gpu_kv_bytes == p.kv_bytes // 2  # 2 of the 4 repeating layers (the output layer goes first)
    assert p.ram_bytes == p.weights_bytes - p.gpu_weights_bytes + p.kv_bytes // 2 + COMPUTE_OVERHEAD_BYTES


def test_no_layer_when_not_even_one_fits(models: list[ModelEntry]) -> None:
    first = models[0]
    assert plan(first, GPU_RESERVE_BYTES + COMPUTE_OVERHEAD_BYTES).gpu_layers == 0
    p = plan(first, 0)
    assert p.gpu_layers == 0 and p.vram_bytes == 0
    assert p.ram_bytes == first.size_bytes + p.kv_bytes + COMPUTE_OVERHEAD_BYTES


def test_gpu_off_and_gpu_layers_override_the_memory(models: list[ModelEntry]) -> None:
    first = models[0]
    roomy = 1 << 40
    assert plan(first, roomy, LoadOptions(parallel=1, gpu="off")).gpu_layers == 0
    assert plan(first, roomy, LoadOptions(parallel=1, gpu_layers=2)).gpu_layers == 2
    assert plan(first, GPU_RESERVE_BYTES, LoadOptions(parallel=1, gpu_layers=2)).gpu_layers == 2  # the user knows
    none = ModelManager(Devices(), OPTIONS, factory=Factory(), cores=1, reap_interval=3600)  # a CPU build
    assert none.plan(first).gpu_layers == 0


def test_a_second_model_is_planned_against_what_the_first_took(models: list[ModelEntry]) -> None:
    first, second = models
    free = GPU_RESERVE_BYTES + whole(first) + COMPUTE_OVERHEAD_BYTES + (whole(second) - COMPUTE_OVERHEAD_BYTES) // 2
    manager = ModelManager(
        devices(free), OPTIONS, factory=Factory(), cores=1, reap_interval=3600, budget=MemoryBudget(max_models=2)
    )
    try:
        assert manager.plan(second).gpu_layers == 7  # alone it fits whole
        loaded = manager.acquire(first)
        assert loaded.plan.gpu_layers == 5
        later = manager.plan(second)
        assert 0 < later.gpu_layers < 7  # what the first left
        assert later.vram_bytes <= free - GPU_RESERVE_BYTES - loaded.plan.vram_bytes
        assert manager.acquire(second).plan == later
        manager.unload(first.id)
        manager.unload(second.id)
        assert manager.plan(second).gpu_layers == 7  # all free again
    finally:
        manager.close()
