"""The real `lmsp-tray` program under Xvfb + trayer: its tray menu drives the real daemon.

The program runs as a user starts it (bare `lmsp-tray`, a temp
LMSP_TRAY_HOME, generated GGUF models in a `--models-dir`), inside its own
D-Bus session without a notification daemon. The test finds the icon trayer
embedded, right-clicks it with xdotool and walks the real Gtk menu with the
keyboard; the effect of each click is checked through the HTTP API
(`GET /lmsp/v1/models`), and API calls are checked to show up in the menu.
To read the menu the test puts tests/probe_site on PYTHONPATH: its
`sitecustomize` dumps the Gtk widgets to `menu.json` (tests/gtk_probe.py)
and changes nothing else. Screenshots go to `test-artifacts/daemon-*.png`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from support import SLOW_ID, SSE, TINY_ID, cli_token, iter_sse, wait_until
from tray_driver import TIMEOUT, TrayProcess, as_shown, shown
from xvfb import ROOT, XSession, missing_tools, spec_keys

from lmsp_tray.desktop.backend import OLLAMA_PORT, compute_text, display_path, keyring_notice
from lmsp_tray.desktop.menu import ModelView, OllamaPortView, TrayState, build_menu
from lmsp_tray.engine.devices import DeviceInfo, Devices

KEYRING_REASON = "no keyring backend is installed or running"
FILES = {TINY_ID: "tiny-test-1m-f32.gguf", SLOW_ID: "slow-test.gguf"}  # as tests/conftest.py names them

pytestmark = [pytest.mark.xvfb, pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())}")]


@pytest.fixture(scope="module")
def xsession():
    try:
        import gi  # noqa: F401
    except ImportError:
        pytest.skip("needs PyGObject")
    with XSession(width=1280, height=720) as session:  # room for the submenu beside the menu
        yield session


def program() -> list[str]:
    """The installed `lmsp-tray` console script next to this Python, else `python -m lmsp_tray`."""
    script = Path(sys.executable).parent / "lmsp-tray"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lmsp_tray"]


class DaemonTray(TrayProcess):
    """`lmsp-tray --port 0 --models-dir DIR --no-default-dirs` with the menu probe."""

    def __init__(self, x: XSession, tmp: Path, models_dir: Path, config: str | None = None) -> None:
        self.home = tmp / "home"
        self.home.mkdir()
        self.lmsp_home = tmp / "lmsp"
        if config is not None:  # config.toml, as the person left it
            self.config_file.parent.mkdir(parents=True)
            self.config_file.write_text(config)
        env = x.env
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"):
            env.pop(name, None)
        env.update(
            PYSTRAY_BACKEND="gtk",
            HOME=str(self.home),
            LMSP_TRAY_HOME=str(self.lmsp_home),
            PYTHONUNBUFFERED="1",
            XDG_CACHE_HOME=str(self.home / ".cache"),
            HF_HOME=str(self.home / "hf"),
            OLLAMA_MODELS=str(self.home / "ollama"),
            # This checkout first (not an installed copy), then the probe's sitecustomize.
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "probe_site")]),
            LMSP_TRAY_PROBE_DIR=str(tmp / "probe"),
            # No keyring on this desktop: the menu must say so (and the API still works with tokens).
            PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring",
        )
        self.token = cli_token(program(), env, cwd=ROOT)
        argv = [*program(), "--port", "0", "--models-dir", str(models_dir), "--no-default-dirs"]
        # A session bus without a notification daemon, as on many minimal desktops.
        argv = ["dbus-run-session", "--", *argv]
        super().__init__(x, tmp / "probe", argv, env, ROOT)

    @property
    def discovery_file(self) -> Path:
        return self.lmsp_home / "run" / "service.json"

    @property
    def config_file(self) -> Path:
        return self.lmsp_home / "config" / "config.toml"

    def url(self) -> str:
        def read() -> str | None:
            assert self.proc.poll() is None, self.output.read_text()
            try:
                return json.loads(self.discovery_file.read_text())["url"]
            except (OSError, ValueError, KeyError):
                return None

        return wait_until(read, 120, "service.json", ignoring=Exception)


def api_compute(client: httpx.Client) -> str:
    """The menu's "Runs on" text for the backend and devices the service document reports."""
    doc = client.get("").json()["extensions"]["lmsp_tray"]
    devices = Devices(
        doc["backend"],
        doc["gpu_offload"],
        tuple(
            DeviceInfo(
                d["name"], d["description"], d["type"], d["backend"], d["memory_total_bytes"], d["memory_free_bytes"]
            )
            for d in doc["devices"]
        ),
        doc.get("device_error"),
    )
    return compute_text(devices)


def api_models(client: httpx.Client) -> list[dict]:
    return client.get("/models").json()["data"]


def api_state(client: httpx.Client, model_id: str) -> str:
    return client.get(f"/models/{model_id}").json()["state"]


def wait_api_state(client: httpx.Client, model_id: str, state: str) -> None:
    wait_until(
        lambda: api_state(client, model_id) == state,
        TIMEOUT,
        f"{model_id} to be {state} in the API",
        ignoring=Exception,
    )


def checked(tray: TrayProcess, model_id: str, value: bool, what: str) -> dict:
    return tray.wait_item("Models", model_id, check=lambda i: i["checked"] is value, what=what)


@pytest.fixture
def tray(xsession, tmp_path, models_dir):
    started = DaemonTray(xsession, tmp_path, models_dir)
    yield started
    started.close()
    print(f"--- lmsp-tray output ---\n{started.output.read_text()[-4000:]}")


def test_real_program_tray_drives_the_daemon(tray, xsession, models_dir):
    url = tray.url()
    window = tray.icon_window()
    print(f"icon embedded {time.monotonic() - tray.started:.2f} s after start")
    wait_until(lambda: tray.menu().get("embedded"), TIMEOUT, "Gtk to report the icon embedded", ignoring=Exception)
    assert tray.menu()["toolkit"] == "gtk"
    geo = xsession.geometry(window)
    assert geo.width >= 16 and geo.height >= 16
    tray.wait_icon_colour("daemon-tray-icon.png", "idle")  # the idle (blue) icon, visible in the tray

    auth = {"Authorization": f"Bearer {tray.token}"}
    with httpx.Client(base_url=url, timeout=60, headers=auth) as api:
        models = api_models(api)
        assert {m["id"] for m in models} == {TINY_ID, SLOW_ID}
        assert tray.wait_item(url)["text"] == f"{url} \u2014 0 of 2 models loaded"
        # The Gtk menu is the pure model's menu for what the API reports.
        expected = build_menu(
            TrayState(
                url=url,
                models=tuple(
                    ModelView(m["id"], m["size_bytes"], m["quantization"], file_name=FILES[m["id"]]) for m in models
                ),
                token_available=True,
                notice=keyring_notice(KEYRING_REASON, tray.lmsp_home / "run" / "owner-token"),
                models_folder=display_path(tray.lmsp_home / "data" / "models"),
                token_session_only=True,
                compute=api_compute(api),
                ollama=OllamaPortView(OLLAMA_PORT, wanted=False, listening=False),
            )
        )
        wait_until(
            lambda: shown(tray.menu()["items"]) == as_shown(expected),
            TIMEOUT,
            "the menu to match the API",
            ignoring=Exception,
        )
        assert tray.keys_to("Models", TINY_ID) == spec_keys(expected, "Models", TINY_ID)
        assert tray.item("Copy access token")["sensitive"] is True  # the session owner token

        tray.show("Models", screenshot="daemon-tray-menu-models.png")

        # Click the model: the daemon loads it (the API says so), and the menu checks it.
        tray.choose("Models", TINY_ID)
        wait_api_state(api, TINY_ID, "loaded")
        item = checked(tray, TINY_ID, True, "the model checked after loading")
        assert item["text"].startswith(f"{TINY_ID} \u00b7 ") and "Loading" not in item["text"]
        tray.wait_item(url, check=lambda i: i["text"].endswith("1 of 2 models loaded"))
        assert tray.item("Unload all")["sensitive"] is True
        tray.show("Models", screenshot="daemon-tray-menu-loaded.png")

        # Click it again: the daemon unloads it.
        tray.choose("Models", TINY_ID)
        wait_api_state(api, TINY_ID, "available")
        checked(tray, TINY_ID, False, "the model unchecked after unloading")

        # A load and an unload through the API show up in the menu without touching it.
        api.post(f"/models/{TINY_ID}/load").raise_for_status()
        loaded_at = time.monotonic()
        checked(tray, TINY_ID, True, "an API load to show in the menu")
        print(f"menu showed the API load {time.monotonic() - loaded_at:.2f} s after the API answered")
        api.post(f"/models/{TINY_ID}/unload").raise_for_status()
        unloaded_at = time.monotonic()
        checked(tray, TINY_ID, False, "an API unload to show in the menu")
        print(f"menu showed the API unload {time.monotonic() - unloaded_at:.2f} s after the API answered")

        # A model file dropped into the folder shows up (the folder watcher tells the tray).
        write_tiny_gguf(models_dir / "fresh-test.gguf", basename="fresh-test", size_label="1M", seed=7)
        dropped_at = time.monotonic()
        tray.wait_item("Models", "fresh-test:1m-f32", what="a new model file to show in the menu")
        print(f"menu showed a new model file {time.monotonic() - dropped_at:.2f} s after it was written")
        assert "fresh-test:1m-f32" in {m["id"] for m in api_models(api)}

        # While a response streams, the icon and the menu say so; Quit ends the stream with a
        # terminal event, unloads, removes the discovery file and exits 0.
        api.post(f"/models/{SLOW_ID}/load").raise_for_status()
        checked(tray, SLOW_ID, True, "the slow model loaded")

        def start_stream() -> tuple[threading.Thread, list[str]]:
            """A 4000-token stream in a thread, returned once its first delta arrived."""
            events: list[str] = []
            streaming = threading.Event()

            def stream() -> None:
                with (
                    httpx.Client(base_url=url, timeout=120, headers=auth) as c,
                    c.stream(
                        "POST",
                        "/responses",
                        json={"model": SLOW_ID, "input": "x", "max_output_tokens": 4000, "stream": True},
                    ) as r,
                ):
                    for event in iter_sse(r):
                        if isinstance(event, SSE):
                            events.append(event.event)
                            if event.event == "response.output_text.delta":
                                streaming.set()

            reader = threading.Thread(target=stream, daemon=True)
            reader.start()
            assert streaming.wait(60)
            return reader, events

        shown_reader, _ = start_stream()
        tray.wait_item("Models", SLOW_ID, check=lambda i: i["text"].endswith("\u2014 generating"))
        wait_until(lambda: tray.menu().get("activity") == "serving", TIMEOUT, "the serving icon", ignoring=Exception)
        tray.wait_icon_colour("daemon-tray-generating.png", "serving")  # painted, before the menu covers the screen
        tray.show("Models", screenshot="daemon-tray-menu-generating.png")
        assert tray.icon_colour_share(ROOT / "test-artifacts" / "daemon-tray-menu-generating.png", "serving") > 0.3

        # A fast machine may finish the first 4000 tokens while the screenshot is taken: Quit
        # right after a fresh stream's first delta, so the stream is surely still running.
        reader, events = start_stream()
        tray.choose("Quit", closes=False)  # the process ends: no more menu dumps
        assert tray.wait_exit(60) == 0
        reader.join(30)
        shown_reader.join(30)
        assert events and events[-1] in {"response.cancelled", "response.failed"}
        assert not tray.discovery_file.exists()
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=2)
    output = tray.output.read_text()
    assert "Traceback" not in output
    assert "from the system tray" in output and "Quit chosen in the tray" in output


def test_the_menu_shows_the_device_and_turns_ollamas_port_off_and_on(xsession, tmp_path, models_dir):
    """The backend and device the service runs on are in the menu as the service document says; the
    second listener for Ollama's apps is on as config.toml asked, and its item writes the setting the
    console's form writes (the listener follows at the next start, and the label says so)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # not 11434 itself: a real Ollama on this machine keeps it
    tray = DaemonTray(xsession, tmp_path, models_dir, config=f"# mine\nollama_port = {port}\n")
    try:
        url = tray.url()
        tray.icon_window()
        with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {tray.token}"}) as api:
            compute = api_compute(api)
        assert compute.startswith(("the CPU", "Vulkan", "CUDA", "Metal"))
        line = tray.wait_item("Runs on ")
        assert line["text"] == f"Runs on {compute}" and line["sensitive"] is False
        on = tray.wait_item(f"Ollama's port {port}", check=lambda i: i["text"].endswith(": on"), what="the listener on")
        assert on["text"] == f"Ollama's port {port}: on" and on["checked"] is True
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).text == "Ollama is running"

        tray.choose(f"Ollama's port {port}")
        # Gtk ticks or clears a check item itself when it is chosen, before the tray rebuilds its
        # menu from the new setting: wait for the label, which only the rebuild writes.
        off = tray.wait_item(
            f"Ollama's port {port}", check=lambda i: not i["text"].endswith(": on"), what="the new label"
        )
        assert off["text"] == f"Ollama's port {port}: off after a restart" and off["checked"] is False
        assert "ollama_port" not in tray.config_file.read_text() and "# mine" in tray.config_file.read_text()

        tray.choose(f"Ollama's port {port}")
        on = tray.wait_item(f"Ollama's port {port}", check=lambda i: i["text"].endswith(": on"), what="the label back")
        assert on["text"] == f"Ollama's port {port}: on" and on["checked"] is True
        assert f"ollama_port = {port}" in tray.config_file.read_text()
        tray.choose("Quit", closes=False)
        assert tray.wait_exit(60) == 0
    finally:
        tray.close()
    assert "Traceback" not in tray.output.read_text()


def test_default_backend_choice_falls_through_to_a_working_one(xsession):
    """Without PYSTRAY_BACKEND pystray tries AppIndicator first; a missing typelib must not cost the tray."""
    env = xsession.env
    env.pop("PYSTRAY_BACKEND", None)
    env["PYTHONPATH"] = str(ROOT)
    code = "from lmsp_tray.desktop.tray import backend_name, load_pystray; print(backend_name(load_pystray()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in {"appindicator", "gtk"}
