"""The console names the backend and devices the service runs with, and where a loaded model sits.

A real daemon and Debian's chromium (Playwright), as in test_console_page.py. The Models and Settings
views read the service document (`GET /lmsp/v1`, `extensions.lmsp_tray`): with the real device probe of
this (CPU) build, and with the devices a probe of a Vulkan build reports (a GPU, or none), which the
daemon plans for; a loaded model's card says how many of its layers are on the GPU and its memory on
each device.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from browser import Console, browser, open_console, screenshot  # noqa: F401 - fixture
from support import TINY_ID, LiveDaemon, wait_until

from lmsp_tray.engine.devices import DeviceInfo, Devices

CPU = DeviceInfo("CPU", "AMD Ryzen 7 7840U", "cpu", "cpu", 32_000_000_000, 20_000_000_000)
GPU = DeviceInfo("Vulkan0", "AMD Radeon 780M", "igpu", "vulkan", 8_000_000_000, 6_400_000_000)


def panel(console: Console, view: str) -> tuple[str, str, list[str]]:
    console.view(view)
    section = console.page.locator(f"#view-{view} section.hardware")
    section.wait_for()
    return (
        section.locator(".backend").text_content() or "",
        section.locator("p").first.text_content() or "",
        section.locator(".devices li").all_text_contents(),
    )


def test_models_and_settings_name_a_gpu_and_its_memory(
    daemon_factory: Callable[..., LiveDaemon],
    browser,
) -> None:
    console = open_console(daemon_factory(devices=Devices("vulkan", True, (CPU, GPU))), browser)
    for view in ("models", "settings"):
        backend, line, devices = panel(console, view)
        assert backend == "Vulkan" and "models go on the GPU where they fit" in line
        assert devices == [
            "AMD Ryzen 7 7840U (CPU) · CPU · 32 GB",
            "AMD Radeon 780M (Vulkan0) · IGPU · 8.0 GB, 6.4 GB free at start",
        ]
    screenshot(console.page, "settings-hardware")
    console.context.close()
    assert console.errors == []


def test_gpu_off_in_the_settings_says_the_cpu_runs_the_models(
    daemon_factory: Callable[..., LiveDaemon],
    browser,
) -> None:
    console = open_console(daemon_factory(devices=Devices("vulkan", True, (CPU, GPU)), gpu="off"), browser)
    backend, line, devices = panel(console, "settings")
    assert backend == "Vulkan" and "models run on the CPU: the GPU setting is off" in line and len(devices) == 2
    console.context.close()
    assert console.errors == []


def test_a_gpu_build_without_a_device_says_the_cpu_runs_the_models(
    daemon_factory: Callable[..., LiveDaemon],
    browser,
) -> None:
    console = open_console(daemon_factory(devices=Devices("vulkan", False, (CPU,))), browser)
    backend, line, devices = panel(console, "models")
    assert backend == "Vulkan" and "llama.cpp is built for Vulkan but sees no Vulkan device" in line
    assert devices == ["AMD Ryzen 7 7840U (CPU) · CPU · 32 GB"]
    console.context.close()
    assert console.errors == []


def test_a_loaded_models_card_says_where_it_sits(
    daemon_factory: Callable[..., LiveDaemon],
    models_dir: Path,
    browser,
) -> None:
    live = daemon_factory()  # the real probe of this build: the CPU alone
    console = open_console(live, browser)
    with console.api() as c:
        document = c.get("").json()["extensions"]["lmsp_tray"]
        backend, line, devices = panel(console, "models")
        assert backend == "CPU" and "llama.cpp is built without a GPU backend" in line
        assert len(devices) == len(document["devices"]) and devices[0].split(" · ")[1] == "CPU"
        c.post(f"/models/{TINY_ID}/load").raise_for_status()
        model = c.get(f"/models/{TINY_ID}").json()["extensions"]["lmsp_tray"]
    page = console.page
    card = page.locator("article.model", has=page.locator("h2", has_text=TINY_ID))
    wait_until(lambda: card.locator(".placement").count() == 1, 30, "the card to show the loaded model")
    placement = card.locator(".placement").text_content() or ""
    assert placement.startswith(f"0 of {model['total_layers']} layers on the GPU · memory: CPU ")
    assert model["devices"][0]["name"] in placement
    assert card.locator(".gpu-fallback").count() == 0
    console.context.close()
    assert console.errors == []
