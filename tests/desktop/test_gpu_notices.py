"""A GPU build that falls back to the CPU tells the person: a desktop notification and a log line.

At start-up, a build whose backend (Vulkan here) sees no device names the backend and where to look;
a model that ran out of GPU memory at load names the GPU and llama.cpp's words (the load itself on a
real Vulkan device: tests/runner/test_vulkan_service.py). Real parts: a real daemon planning for the
devices a probe of such a build reports, the tray's notification code (`Notices` over the real
`Notifier`) on a private D-Bus with the test notification server (tests/notify_server.py).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from desktop_support import dbus_missing, tray_notices
from notify_server import NotifyServer
from support import TINY_ID, LiveDaemon

from lmsp_tray.desktop.service_notices import gpu_notification, watch_gpu
from lmsp_tray.engine import process
from lmsp_tray.engine.devices import DeviceInfo, Devices, probe
from lmsp_tray.engine.loaded import Placement

CPU = DeviceInfo("CPU", "Intel Xeon", "cpu", "cpu", 16 << 30, 8 << 30)
GPU = DeviceInfo("Vulkan0", "AMD Radeon 780M", "igpu", "vulkan", 8 << 30, 6 << 30)
NO_DEVICE = Devices(backend="vulkan", gpu_offload=False, devices=(CPU,))  # a Vulkan build, no Vulkan device
FALLBACK = "Vulkan0 ran out of memory with 5 of 5 layers planned (llama.cpp: unable to allocate Vulkan0 buffer); 2 run on the GPU"


def test_the_texts_name_the_backend_or_the_gpu_and_why() -> None:
    said = gpu_notification(NO_DEVICE)
    assert said == (
        "llama.cpp is built for Vulkan but sees no Vulkan device (is a Vulkan driver installed? vulkaninfo "
        "--summary should list the GPU); models run on the CPU."
    )
    assert gpu_notification(Devices(backend="cuda", gpu_offload=False, devices=(CPU,))).startswith(  # type: ignore[union-attr]
        "llama.cpp is built for CUDA but sees no CUDA device (is the NVIDIA driver loaded?"
    )
    # Nothing fell back: a CPU build, a GPU found, a probe that failed (its own warning says why)
    assert gpu_notification(Devices(devices=(CPU,))) is None
    assert gpu_notification(Devices(backend="vulkan", gpu_offload=True, devices=(CPU, GPU))) is None
    assert gpu_notification(Devices(error="the device probe exited with 1")) is None
    assert gpu_notification(None, TINY_ID, FALLBACK) == f"{TINY_ID}: {FALLBACK}."
    assert gpu_notification(None, TINY_ID, None) is None


def test_the_probe_logs_a_gpu_build_without_a_device(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    answer = tmp_path / "answer.json"  # what a probe of a Vulkan build prints on a machine without the driver
    answer.write_text(json.dumps(NO_DEVICE.to_json()))
    script = tmp_path / "probe.py"
    script.write_text(f"print(open({str(answer)!r}).read())\n")
    with caplog.at_level(logging.WARNING, logger="lmsp_tray.engine.devices"):
        devices = probe([sys.executable, str(script)])
    assert devices == NO_DEVICE
    assert [r.getMessage() for r in caplog.records] == [str(NO_DEVICE.cpu_fallback)]


@pytest.fixture
def notices(tmp_path: Path) -> Iterator[tuple[Any, NotifyServer]]:
    missing = dbus_missing()
    if missing:
        pytest.skip(missing)
    with tray_notices(tmp_path / "notifications.jsonl") as sink:
        yield sink


def test_a_daemon_on_a_gpu_build_without_a_device_notifies_at_start(
    daemon_factory: Callable[..., LiveDaemon], notices: tuple[Any, NotifyServer]
) -> None:
    app, server = notices
    live = daemon_factory(devices=NO_DEVICE)
    watch_gpu(app, live.daemon)
    note = server.wait(lambda n: "Vulkan" in n["body"], what="the no-device notification")
    assert note["summary"] == "lmsp-tray: the GPU is not used" and note["body"] == gpu_notification(NO_DEVICE)
    assert note["app"] == "lmsp-tray"


def test_gpu_off_is_the_persons_choice_and_no_fallback(
    daemon_factory: Callable[..., LiveDaemon], notices: tuple[Any, NotifyServer]
) -> None:
    app, server = notices
    live = daemon_factory(devices=NO_DEVICE, gpu="off")
    watch_gpu(app, live.daemon)
    app.notify("marker", title="marker")  # what came before it came in order
    server.wait(lambda n: n["body"] == "marker", what="the marker")
    assert [n["body"] for n in server.records()] == ["marker"]


def test_a_load_that_fell_back_notifies_naming_the_gpu(
    daemon_factory: Callable[..., LiveDaemon], notices: tuple[Any, NotifyServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model process says so in its placement; on this CPU build no GPU can run out of memory, so the
    placement it reports gets the `gpu_fallback` a Vulkan load reports (test_vulkan_service.py)."""
    app, server = notices
    live = daemon_factory()
    daemon = live.daemon
    watch_gpu(app, daemon)

    def fell_back(**facts: Any) -> Placement:  # what the model process reports after such a load
        return Placement(**{**facts, "gpu_fallback": FALLBACK})

    monkeypatch.setattr(process, "Placement", fell_back)
    loaded = httpx.post(f"{live.url}/models/{TINY_ID}/load", headers=live.auth_headers, timeout=120)
    assert loaded.status_code == 200, loaded.text
    note = server.wait(lambda n: "ran out of memory" in n["body"], what="the fallback notification")
    assert note["summary"] == "lmsp-tray: fewer layers on the GPU" and note["body"] == f"{TINY_ID}: {FALLBACK}."
    model = httpx.get(f"{live.url}/models/{TINY_ID}", headers=live.auth_headers, timeout=30).json()
    assert model["extensions"]["lmsp_tray"]["gpu_fallback"] == FALLBACK  # the listing says it too
