"""The device probe: what llama.cpp sees, asked of a short-lived process, and the CPU alone when
asking fails (the service must start whatever the probe does)."""

from __future__ import annotations

import logging
import sys

import pytest

from lmsp_tray.engine.devices import CPU_ONLY, DeviceInfo, Devices, probe


def test_the_probe_reports_the_build_and_its_devices() -> None:
    devices = probe()
    assert devices.error is None
    assert devices.backend in {"cpu", "cuda", "vulkan", "metal", "hip", "sycl", "opencl", "cann", "musa"}
    cpus = [d for d in devices.devices if d.type == "cpu"]
    assert cpus and cpus[0].backend == "cpu" and cpus[0].name
    assert all(d.total_bytes >= d.free_bytes >= 0 for d in devices.devices)
    assert devices.has_gpu == bool(devices.gpus) and (devices.gpu_free_bytes is None) == (not devices.gpus)
    assert Devices.from_json(devices.to_json()) == devices


def test_gpus_count_only_with_gpu_offload() -> None:
    gpu = DeviceInfo("CUDA0", "A GPU", "gpu", "cuda", 24_000_000_000, 20_000_000_000)
    igpu = DeviceInfo("Vulkan1", "An iGPU", "igpu", "vulkan", 8_000_000_000, 6_000_000_000)
    cpu = DeviceInfo("CPU", "A CPU", "cpu", "cpu", 64_000_000_000, 60_000_000_000)
    devices = Devices("cuda", True, (cpu, gpu, igpu))
    assert devices.gpus == (gpu, igpu)
    assert devices.gpu_free_bytes == 26_000_000_000 and devices.gpu_total_bytes == 32_000_000_000
    without = Devices("cuda", False, (cpu, gpu))
    assert not without.has_gpu and without.gpu_free_bytes is None and without.gpu_total_bytes == 0


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import sys; sys.stderr.write('no llama here\\n'); sys.exit(3)", "exited with 3 (no llama here)"),
        ("print('not json')", "answered oddly"),
        ("print('[1, 2]')", "answered oddly"),
        ('print(\'{"backend": "cpu"}\')', "answered oddly"),
    ],
)
def test_a_failed_probe_is_logged_and_gives_the_cpu_alone(
    code: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lmsp_tray.engine.devices")
    devices = probe([sys.executable, "-c", code])
    assert devices == Devices(error=devices.error) and devices.devices == CPU_ONLY.devices
    assert devices.error is not None and reason in devices.error
    assert not devices.has_gpu and devices.backend == "cpu"
    assert reason in caplog.text and "CPU alone" in caplog.text


def test_a_probe_that_hangs_is_given_up() -> None:
    devices = probe([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert devices.error is not None and "did not run" in devices.error and not devices.has_gpu


def test_a_probe_that_cannot_start_gives_the_cpu_alone() -> None:
    devices = probe(["/nonexistent/lmsp-probe"])
    assert devices.error is not None and "did not run" in devices.error
