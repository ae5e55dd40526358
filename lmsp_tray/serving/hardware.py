"""What the service tells about its hardware: llama.cpp's backend and devices, and where a model runs.

Why a module: `GET /lmsp/v1` says which backend the loaded llama.cpp was built with and which devices
it sees (the device probe's `Devices`, asked once at start-up), and each loaded model's object says
how much of it sits on each device. Both shapes are built here, from the probe and the load plan, so
the service document and the model objects name the devices alike.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.engine.devices import Devices
from lmsp_tray.engine.load_plan import LoadPlan

CPU_NAME = "CPU"


def backend_document(devices: Devices | None, gpu_setting: str = "auto") -> dict[str, Any]:
    """`extensions.lmsp_tray` of the service document: the build's backend ("cpu", "vulkan", "cuda",
    "metal", ...), whether it can offload layers at all, and each device with its memory (free: when
    the service started); `gpu: "off"` while the `gpu` setting keeps every model on the CPU."""
    devices = devices or Devices(error="the devices were not probed")
    doc: dict[str, Any] = {
        "backend": devices.backend,
        "gpu_offload": devices.gpu_offload,
        "devices": [
            {
                "name": d.name,
                "description": d.description,
                "type": d.type,
                "backend": d.backend,
                "memory_total_bytes": d.total_bytes,
                "memory_free_bytes": d.free_bytes,
            }
            for d in devices.devices
        ],
    }
    if devices.error is not None:
        doc["device_error"] = devices.error  # the probe failed: models run on the CPU
    if gpu_setting == "off":
        doc["gpu"] = "off"  # the person's choice: models run on the CPU whatever the devices
    return doc


def memory_by_device(plan: LoadPlan, devices: Devices | None) -> list[dict[str, Any]]:
    """Where a loaded model's memory is, device by device (estimated from its load plan): the host's
    share on the CPU, the offloaded layers' on the GPUs, split as llama.cpp splits layers between
    several GPUs (by their free memory)."""
    gpus = devices.gpus if devices is not None else ()
    cpu = next((d.name for d in devices.devices if d.type == "cpu"), CPU_NAME) if devices else CPU_NAME
    placed = [{"name": cpu, "type": "cpu", "memory_bytes": plan.ram_bytes}]
    if plan.vram_bytes and gpus:
        free = sum(g.free_bytes for g in gpus) or len(gpus)
        for gpu in gpus:
            share = (gpu.free_bytes or 1) / free
            placed.append({"name": gpu.name, "type": gpu.type, "memory_bytes": int(plan.vram_bytes * share)})
    return placed
