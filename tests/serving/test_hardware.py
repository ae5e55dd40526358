"""What the service says about its hardware: the backend and devices of the service document, and a
loaded model's memory device by device (a GPU build is described here with the probe's dataclasses; the
Vulkan tests see the same from a real device)."""

from __future__ import annotations

from lmsp_tray.engine.devices import DeviceInfo, Devices
from lmsp_tray.engine.load_plan import COMPUTE_OVERHEAD_BYTES, LoadPlan
from lmsp_tray.serving.hardware import backend_document, memory_by_device

GB = 1 << 30
CPU = DeviceInfo("CPU", "Xeon", "cpu", "cpu", 64 * GB, 60 * GB)
GPU0 = DeviceInfo("Vulkan0", "Radeon", "gpu", "vulkan", 16 * GB, 12 * GB)
GPU1 = DeviceInfo("Vulkan1", "Arc", "gpu", "vulkan", 8 * GB, 4 * GB)


def test_the_backend_and_every_device_with_its_memory() -> None:
    doc = backend_document(Devices("vulkan", True, (CPU, GPU0)))
    assert doc["backend"] == "vulkan" and doc["gpu_offload"] is True and "device_error" not in doc
    assert doc["devices"][1] == {
        "name": "Vulkan0",
        "description": "Radeon",
        "type": "gpu",
        "backend": "vulkan",
        "memory_total_bytes": 16 * GB,
        "memory_free_bytes": 12 * GB,
    }
    failed = backend_document(Devices(error="the device probe exited with 1"))
    assert failed == {"backend": "cpu", "gpu_offload": False, "devices": [], "device_error": failed["device_error"]}
    assert "exited with 1" in failed["device_error"]
    assert backend_document(Devices("vulkan", True, (CPU, GPU0)), "off")["gpu"] == "off"  # the setting, not the build
    assert "gpu" not in doc


def test_a_model_split_between_the_cpu_and_two_gpus() -> None:
    plan = LoadPlan(4096, 1, gpu_layers=17, total_layers=33, threads=4, weights_bytes=4 * GB, kv_bytes=GB)
    cpu, gpu0, gpu1 = memory_by_device(plan, Devices("vulkan", True, (CPU, GPU0, GPU1)))
    assert cpu == {"name": "CPU", "type": "cpu", "memory_bytes": plan.ram_bytes}
    assert plan.ram_bytes == 4 * GB - plan.gpu_weights_bytes + GB // 2 + COMPUTE_OVERHEAD_BYTES
    assert gpu0["name"] == "Vulkan0" and gpu1["name"] == "Vulkan1"
    assert abs(gpu0["memory_bytes"] - 3 * gpu1["memory_bytes"]) <= 3  # split as their free memory (12 : 4)
    assert abs(gpu0["memory_bytes"] + gpu1["memory_bytes"] - plan.vram_bytes) <= 1
    on_cpu = LoadPlan(4096, 1, gpu_layers=0, total_layers=33, threads=4, weights_bytes=4 * GB, kv_bytes=GB)
    assert memory_by_device(on_cpu, Devices("vulkan", True, (CPU, GPU0))) == [
        {"name": "CPU", "type": "cpu", "memory_bytes": 5 * GB + COMPUTE_OVERHEAD_BYTES}
    ]
