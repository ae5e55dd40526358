"""The menu's line for where models run (llama.cpp's backend and device) and its item for Ollama's port:
their texts for each state (the real tray shows them: tests/e2e/test_tray_daemon_xvfb.py)."""

from __future__ import annotations

from lmsp_tray.desktop.backend import compute_text
from lmsp_tray.desktop.menu import Action, OllamaPortView, TrayState, build_menu, ollama_item, status_text
from lmsp_tray.engine.devices import DeviceInfo, Devices

CPU = DeviceInfo("CPU", "AMD Ryzen 7 7840U", "cpu", "cpu", 32 << 30, 20 << 30)
GPU = DeviceInfo("Vulkan0", "AMD Radeon 780M", "igpu", "vulkan", 8 << 30, 6 << 30)


def test_where_models_run_in_a_few_words() -> None:
    assert compute_text(Devices("vulkan", True, (CPU, GPU))) == "Vulkan: AMD Radeon 780M (8.6 GB)"
    assert (
        compute_text(Devices("vulkan", True, (CPU, GPU)), "off")
        == "the CPU (AMD Ryzen 7 7840U): GPU off in the settings"
    )
    assert (
        compute_text(Devices("vulkan", False, (CPU,)))
        == "the CPU (AMD Ryzen 7 7840U): llama.cpp's Vulkan sees no device"
    )
    assert compute_text(Devices("cpu", False, (CPU,))) == (
        "the CPU (AMD Ryzen 7 7840U): llama.cpp is built without a GPU backend"
    )
    assert compute_text(Devices(error="the device probe exited with 1")) == "the CPU: the device probe failed"


def test_the_compute_line_sits_under_the_status_and_in_the_status_text() -> None:
    state = TrayState(url="http://127.0.0.1:7373/lmsp/v1", compute="Vulkan: AMD Radeon 780M (8.6 GB)")
    items = build_menu(state)
    assert items[1].text == "Runs on Vulkan: AMD Radeon 780M (8.6 GB)" and items[1].enabled is False
    assert status_text(state).splitlines()[1] == "Runs on Vulkan: AMD Radeon 780M (8.6 GB)"
    assert not any(i.text.startswith(("Runs on", "Ollama's port")) for i in build_menu(TrayState()))


def test_ollamas_port_item_says_what_runs_and_what_waits_for_a_restart() -> None:
    def shown(view: OllamaPortView) -> tuple[str, bool | None, str | None]:
        item = ollama_item(view)
        assert item.action is Action.SET_OLLAMA_PORT
        return item.text, item.checked, item.arg

    assert shown(OllamaPortView(11434, False, False)) == ("Ollama's port 11434: off", False, "on")
    assert shown(OllamaPortView(11434, True, True)) == ("Ollama's port 11434: on", True, "off")
    assert shown(OllamaPortView(11434, True, False)) == ("Ollama's port 11434: on after a restart", True, "off")
    assert shown(OllamaPortView(11434, True, False, taken=True)) == (
        "Ollama's port 11434: taken by another program",
        True,
        "off",
    )
    assert shown(OllamaPortView(11434, False, True)) == ("Ollama's port 11434: off after a restart", False, "on")
    menu = build_menu(TrayState(ollama=OllamaPortView(11434, False, False)))
    texts = [i.text for i in menu]
    assert texts.index("Ollama's port 11434: off") == texts.index("View logs") - 1
