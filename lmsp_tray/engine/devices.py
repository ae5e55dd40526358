"""What this machine offers a model: llama.cpp's backend and devices (from a probe), and its cores.

Why a probe: listing devices takes llama.cpp's backend — `libllama`, `libggml` and, on a GPU build,
the driver's libraries — and the service must never load those (a model process may crash; the
service may not, nor carry a GPU driver's memory). So the service asks once, at start-up, a
short-lived process running `lmsp_tray.runner.probe`, which prints `Devices.to_json()` on its
stdout, and keeps the answer. A probe that fails (no llama.cpp, a crash, garbage, a hang) is
logged and the service plans for the CPU alone (`CPU_ONLY`). The same dataclasses describe the
devices inside a model process (`runner.runtime`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lmsp_tray.engine import launch

log = logging.getLogger("lmsp_tray.engine.devices")

PROBE_TIMEOUT_S = 60.0  # a GPU driver's first start can take a while; after this, the CPU alone
GPU_TYPES = ("gpu", "igpu")  # the device types layers are offloaded to
CPU_BACKENDS = ("cpu", "blas", "rpc")  # backends that are no accelerator of their own
BACKEND_NAMES = {"cuda": "CUDA", "vulkan": "Vulkan", "metal": "Metal", "rocm": "ROCm", "hip": "ROCm", "sycl": "SYCL"}
BACKEND_HINTS = {  # where to look when a GPU build finds no device
    "cuda": " (is the NVIDIA driver loaded? nvidia-smi should list the GPU)",
    "vulkan": " (is a Vulkan driver installed? vulkaninfo --summary should list the GPU)",
}


@dataclass(frozen=True)
class DeviceInfo:
    """One device llama.cpp's backends see (ggml's device registry)."""

    name: str
    description: str
    type: str  # "cpu", "gpu", "igpu" (integrated), "accel"
    backend: str  # the backend it belongs to, lower case: "cpu", "cuda", "vulkan", "metal", ...
    total_bytes: int
    free_bytes: int  # when probed


@dataclass(frozen=True)
class Devices:
    """llama.cpp's build and devices as probed: `backend` is the build's accelerator backend ("cpu"
    when it has none), `gpu_offload` whether it can put layers on a GPU at all; `error` says why a
    probe failed (then this is `CPU_ONLY` with the reason)."""

    backend: str = "cpu"
    gpu_offload: bool = False
    devices: tuple[DeviceInfo, ...] = ()
    error: str | None = None

    @property
    def gpus(self) -> tuple[DeviceInfo, ...]:
        """The devices layers can be offloaded to (none without GPU offload)."""
        return tuple(d for d in self.devices if d.type in GPU_TYPES) if self.gpu_offload else ()

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def gpu_free_bytes(self) -> int | None:
        """Free memory on the GPUs when probed, or None when there is no usable GPU."""
        return sum(d.free_bytes for d in self.gpus) if self.gpus else None

    @property
    def gpu_total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.gpus)

    @property
    def cpu_fallback(self) -> str | None:
        """Why a GPU build runs its models on the CPU: its backend sees no device to offload to (no
        driver, a GPU the backend cannot use, or none made visible). None on a CPU build, with a GPU,
        or when the probe itself failed (`error` says why)."""
        if self.backend in CPU_BACKENDS or self.has_gpu or self.error is not None:
            return None
        name = BACKEND_NAMES.get(self.backend, self.backend)
        hint = BACKEND_HINTS.get(self.backend, "")
        return f"llama.cpp is built for {name} but sees no {name} device{hint}; models run on the CPU"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Devices:
        """Raises TypeError, KeyError or ValueError on anything but `to_json()`'s shape."""
        if not isinstance(data, dict):
            raise TypeError(f"a JSON object was expected, not {type(data).__name__}")
        devices = tuple(
            DeviceInfo(
                name=str(d["name"]),
                description=str(d["description"]),
                type=str(d["type"]),
                backend=str(d["backend"]),
                total_bytes=int(d["total_bytes"]),
                free_bytes=int(d["free_bytes"]),
            )
            for d in data["devices"]
        )
        error = data.get("error")
        return cls(str(data["backend"]), bool(data["gpu_offload"]), devices, None if error is None else str(error))


CPU_ONLY = Devices()


def probe(command: Sequence[str] | None = None, *, timeout: float = PROBE_TIMEOUT_S) -> Devices:
    """Ask a short-lived model-side process what llama.cpp sees (blocking: seconds at most; call it
    off the event loop, once). Never raises: a failed probe is logged and gives the CPU alone."""
    try:
        done = subprocess.run(
            list(command or launch.probe_command()),
            cwd=launch.home(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=dict(os.environ, GGML_NO_BACKTRACE="1"),
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return _failed(f"the device probe did not run: {exc}")
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return _failed(f"the device probe exited with {done.returncode}" + (f" ({said[-1][:300]})" if said else ""))
    try:
        devices = Devices.from_json(json.loads(done.stdout))
    except (ValueError, TypeError, KeyError) as exc:
        return _failed(f"the device probe answered oddly ({exc})")
    log.info(
        "llama.cpp backend %s; devices: %s",
        devices.backend,
        ", ".join(f"{d.name} ({d.type}, {d.total_bytes / 1e9:.1f} GB)" for d in devices.devices) or "none",
    )
    if devices.cpu_fallback is not None:
        log.warning("%s", devices.cpu_fallback)
    return devices


def _failed(reason: str) -> Devices:
    log.warning("%s; models are planned for the CPU alone", reason)
    return Devices(error=reason)


def physical_cores() -> int:
    """Physical CPU cores (not hyper-threads); llama.cpp decodes fastest with one thread per core."""
    try:
        cores: set[tuple[str, str]] = set()
        physical = core = None
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    physical = value
                elif key == "core id":
                    core = value
                elif not key and core is not None:
                    cores.add((physical or "0", core))
                    physical = core = None
        if core is not None:
            cores.add((physical or "0", core))
        if cores:
            return len(cores)
    except OSError:
        pass
    count = os.cpu_count() or 2
    return max(1, count // 2) if count > 4 else count
