"""The GPU path end to end on a real Vulkan device (lavapipe in CI): a real daemon reports the Vulkan
backend and its device, offloads every layer of a generated model and shows it, answers greedily as the
same build does on the CPU, offloads part of a model when the planner is told the device has little
memory, plans a second model on the device against what the first took, and falls back to fewer layers
when the device cannot allocate what the plan asked for. The person is told of both fall-backs: a build
that sees no Vulkan device, and a load that ran out of device memory, each raise a desktop notification
(the tray's code, on a private D-Bus with the test notification server).

Runs in the Vulkan venv only (marked `vulkan`, vulkan_support.py). lavapipe compiles its pipelines at a
model's first use (seconds on two cores), so each test loads few models. The out-of-memory test lowers the
device's buffer limit with ggml-vulkan's own GGML_VK_FORCE_MAX_BUFFER_SIZE (lavapipe allocates host memory
and would not run out): the load then fails inside llama.cpp's Vulkan backend ("unable to allocate Vulkan0
buffer") as on a full GPU, and the model process retries with fewer layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from desktop_support import dbus_missing, tray_notices
from gguf_factory import write_tiny_gguf
from notify_server import NotifyServer
from support import SLOW_ID, TINY_ID, LiveDaemon, body

from lmsp_tray.desktop.service_notices import watch_crashes, watch_gpu
from lmsp_tray.engine.devices import Devices, probe
from lmsp_tray.engine.load_plan import COMPUTE_OVERHEAD_BYTES, GPU_RESERVE_BYTES

pytestmark = [pytest.mark.vulkan, pytest.mark.timeout(600)]

BIG_ID = "big-test:40m-f32"


def client(daemon: LiveDaemon) -> httpx.Client:
    return httpx.Client(base_url=daemon.url, timeout=300, headers=daemon.auth_headers)


def answer(c: httpx.Client, model: str) -> str:
    r = c.post("/responses", json=body("Say something", model=model, max_output_tokens=8))
    assert r.status_code == 200, r.text
    return r.json()["output"][0]["content"][0]["text"]


def on_device(c: httpx.Client, model: str) -> dict:
    r = c.post(f"/models/{model}/load")
    assert r.status_code == 200, r.text
    return r.json()["extensions"]["lmsp_tray"]


def with_free(devices: Devices, free: int) -> Devices:
    """The probed devices, the GPU's free memory set to `free` (what the planner is told)."""
    return replace(
        devices, devices=tuple(replace(d, free_bytes=free) if d.type == "gpu" else d for d in devices.devices)
    )


def test_the_daemon_reports_vulkan_offloads_every_layer_and_answers_as_on_the_cpu(
    daemon_factory: Callable[..., LiveDaemon],
) -> None:
    gpu = daemon_factory()
    with client(gpu) as c:
        hardware = c.get("").json()["extensions"]["lmsp_tray"]
        assert hardware["backend"] == "vulkan" and hardware["gpu_offload"] is True
        [vulkan] = [d for d in hardware["devices"] if d["name"].startswith("Vulkan")]
        assert vulkan["type"] == "gpu" and vulkan["memory_total_bytes"] > 0, hardware
        placed = on_device(c, TINY_ID)
        assert placed["device"] == "gpu" and placed["gpu_layers"] == placed["total_layers"] == 3
        assert [d["name"] for d in placed["devices"]] == ["CPU", vulkan["name"]]
        assert placed["devices"][1]["memory_bytes"] > 0 and "gpu_fallback" not in placed
        on_gpu = answer(c, TINY_ID)
    gpu.stop()
    cpu = daemon_factory(gpu="off")  # the same build, every layer on the CPU
    with client(cpu) as c:
        assert on_device(c, TINY_ID)["gpu_layers"] == 0
        assert answer(c, TINY_ID) == on_gpu and on_gpu


def test_partial_offload_and_two_models_on_one_device(daemon_factory: Callable[..., LiveDaemon]) -> None:
    devices = probe()
    assert devices.backend == "vulkan" and devices.has_gpu, devices
    # Room for the tiny model whole and a part of the slow one beside it.
    free = GPU_RESERVE_BYTES + 2 * COMPUTE_OVERHEAD_BYTES + 6_000_000
    live = daemon_factory(devices=with_free(devices, free))
    with client(live) as c:
        first = on_device(c, TINY_ID)
        assert first["gpu_layers"] == first["total_layers"] == 3  # it fits
        second = on_device(c, SLOW_ID)  # planned against what the first took: only part of it fits
        assert 0 < second["gpu_layers"] < second["total_layers"] == 5, second
        assert second["devices"][0]["memory_bytes"] > COMPUTE_OVERHEAD_BYTES  # the rest runs on the CPU
        assert answer(c, SLOW_ID) and answer(c, TINY_ID)
        loaded = [m["id"] for m in c.get("/models").json()["data"] if m["state"] == "loaded"]
        assert sorted(loaded) == sorted([TINY_ID, SLOW_ID])
    live.stop()  # one daemon per home at a time
    assert on_device_alone(daemon_factory, with_free(devices, GPU_RESERVE_BYTES))["gpu_layers"] == 0  # none fit


def on_device_alone(daemon_factory: Callable[..., LiveDaemon], devices: Devices) -> dict:
    with client(daemon_factory(devices=devices)) as c:
        return on_device(c, TINY_ID)


@pytest.fixture
def model_files(tiny_gguf: Path, slow_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    big = write_tiny_gguf(
        tmp_path_factory.mktemp("big") / "big-test.gguf",
        basename="big-test",
        size_label="40M",
        embedding=512,
        heads=8,
        heads_kv=8,
        blocks=4,
        ffn=1024,
    )
    return [tiny_gguf, slow_gguf, big]


def test_a_device_out_of_memory_at_load_retries_with_fewer_layers(
    daemon_factory: Callable[..., LiveDaemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The 5 layers' weights (~42 MB) need one buffer over the limit; the output layer and one block fit.
    monkeypatch.setenv("GGML_VK_FORCE_MAX_BUFFER_SIZE", "25000000")
    live = daemon_factory()
    with client(live) as c:
        placed = on_device(c, BIG_ID)
        assert placed["gpu_layers"] == 2 and placed["total_layers"] == 5, placed
        assert "Vulkan0 ran out of memory with 5 of 5 layers" in placed["gpu_fallback"]
        assert "unable to allocate" in placed["gpu_fallback"] or "failed to allocate" in placed["gpu_fallback"]
        assert c.get(f"/models/{BIG_ID}").json()["extensions"]["lmsp_tray"]["gpu_layers"] == 2
        assert answer(c, BIG_ID)


@pytest.fixture
def notices(tmp_path: Path) -> Iterator[tuple[Any, NotifyServer]]:
    missing = dbus_missing()
    if missing:
        pytest.fail(missing)
    with tray_notices(tmp_path / "notifications.jsonl") as sink:
        yield sink


def test_a_vulkan_build_that_sees_no_device_says_so(
    daemon_factory: Callable[..., LiveDaemon], notices: tuple[Any, NotifyServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES")  # lavapipe, a CPU-type device, is skipped unless named
    app, server = notices
    live = daemon_factory()  # the real probe
    hardware = httpx.get(live.url, timeout=30).json()["extensions"]["lmsp_tray"]
    assert hardware["backend"] == "vulkan" and [d["type"] for d in hardware["devices"]] == ["cpu"], hardware
    watch_gpu(app, live.daemon)
    note = server.wait(lambda n: "Vulkan" in n["body"], what="the no-device notification")
    assert note["body"].startswith("llama.cpp is built for Vulkan but sees no Vulkan device")
    assert note["body"].endswith("models run on the CPU.")


def test_a_load_out_of_device_memory_notifies_naming_the_gpu(
    daemon_factory: Callable[..., LiveDaemon], notices: tuple[Any, NotifyServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GGML_VK_FORCE_MAX_BUFFER_SIZE", "25000000")  # as in the test above
    app, server = notices
    live = daemon_factory()
    watch_gpu(app, live.daemon)
    with client(live) as c:
        placed = on_device(c, BIG_ID)
    note = server.wait(lambda n: BIG_ID in n["body"], what="the fall-back notification")
    assert note["summary"] == "lmsp-tray: fewer layers on the GPU"
    assert note["body"] == f"{BIG_ID}: {placed['gpu_fallback']}." and "Vulkan0 ran out of memory" in note["body"]
    assert not any("sees no" in n["body"] for n in server.records())  # the device is visible here


def test_a_model_process_dying_on_the_gpu_ends_that_model_only_and_names_the_gpu(
    daemon_factory: Callable[..., LiveDaemon], notices: tuple[Any, NotifyServer]
) -> None:
    """A driver error or a lost device kills the model's process (here: SIGKILL to it, on lavapipe): the
    service answers on, the notification names the GPU it ran on, the next request loads it again."""
    import os
    import signal

    app, server = notices
    live = daemon_factory()
    watch_crashes(app, live.daemon)
    with client(live) as c:
        placed = on_device(c, TINY_ID)
        assert placed["device"] == "gpu"
        model = live.daemon.models.get(TINY_ID)
        assert model is not None and model.placement.description.startswith("GPU (")
        os.kill(model.stats().pid or 0, signal.SIGKILL)
        note = server.wait(lambda n: TINY_ID in n["body"], what="the crash notification")
        assert note["body"].startswith(f"The model '{TINY_ID}' stopped (it ran on {model.placement.description}): ")
        assert c.get("").status_code == 200  # the service answers throughout
        assert answer(c, TINY_ID)  # loaded anew on the device
