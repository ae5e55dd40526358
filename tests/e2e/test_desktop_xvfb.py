"""The tray a person meets, for real: the `lmsp-tray` program under Xvfb, with or without a tray host,
with a notification server (tests/notify_server.py) and, for AppIndicator, a StatusNotifierWatcher
(tests/dbus_fakes.py) on a private D-Bus session bus.

What is checked is what a person sees: the icon in the tray (screenshots measured by pixels, in
test-artifacts/), the menu window, the real Gtk menu's items (dumped by tests/probe_site), the
notifications the server was sent (summary, body, app name, ids, buttons), and the API's answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from desktop_support import DBusFake, PrivateBus, dbus_missing, lmsp_env, log_text, program
from notify_server import NotifyServer
from support import SLOW_ID, TINY_ID, wait_until
from tray_driver import TIMEOUT, TrayProcess
from xvfb import ROOT, XSession, missing_tools

pytestmark = [
    pytest.mark.xvfb,
    pytest.mark.skipif(bool(missing_tools() or dbus_missing()), reason=f"needs {missing_tools() or dbus_missing()}"),
]


@pytest.fixture
def bus(tmp_path):
    with PrivateBus() as b:
        yield b


@pytest.fixture
def notifications(bus, tmp_path):
    server = NotifyServer(bus.address, tmp_path / "notifications.jsonl", caps="body,actions")
    yield server
    server.stop()


class LiveTray(TrayProcess):
    """Bare `lmsp-tray` (the tray command) as a launcher starts it, with the menu probe."""

    def __init__(self, x: XSession, tmp: Path, models_dir: Path, bus: str, **env_extra: str) -> None:
        self.home = tmp
        env = lmsp_env(tmp, bus=bus, display=x.display_name)
        env.update(
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "probe_site")]),
            LMSP_TRAY_PROBE_DIR=str(tmp / "probe"),
            **env_extra,
        )
        self.env = env
        argv = [*program(), "--port", "0", "--models-dir", str(models_dir), "--no-default-dirs"]
        super().__init__(x, tmp / "probe", argv, env, ROOT)

    def url(self) -> str:
        discovery = self.home / "lmsp" / "run" / "service.json"

        def read() -> str | None:
            assert self.proc.poll() is None, self.output.read_text()
            try:
                return json.loads(discovery.read_text())["url"]
            except (OSError, ValueError, KeyError):
                return None

        return wait_until(read, 120, "service.json", ignoring=Exception)

    def said(self, text: str, timeout: float = TIMEOUT) -> str:
        return wait_until(
            lambda: text in self.output.read_text() and self.output.read_text(), timeout, repr(text), ignoring=Exception
        )

    def owner_token(self) -> str:
        return (self.home / "lmsp" / "run" / "owner-token").read_text().strip()


def api(tray: LiveTray, url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {tray.owner_token()}"})


def colour_share(x: XSession, window: int, shot: Path, activity: str) -> float:
    from PIL import Image

    from lmsp_tray.desktop.icons import COLOURS

    geo = x.geometry(window)
    with Image.open(shot) as image:
        raw = image.convert("RGB").crop(geo.box()).tobytes()
    pixels = [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]
    return sum(1 for p in pixels if p == COLOURS[activity][0]) / max(len(pixels), 1)


def test_the_tray_a_person_meets(tmp_path, models_dir, bus, notifications):
    """Left-click console, right-click menu, live menu, idle vs ready, second launch, notifications
    with buttons, Quit."""
    opened = tmp_path / "browser-opened.txt"
    browser = tmp_path / "browser.sh"  # the person's browser: records what it was asked to open
    browser.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    browser.chmod(0o755)
    with XSession(width=1280, height=720) as x:
        tray = LiveTray(x, tmp_path, models_dir, bus.address, BROWSER=str(browser))
        try:
            url = tray.url()
            window = tray.icon_window()
            tray.said("from the system tray (gtk)")
            wait_until(lambda: tray.menu().get("embedded"), TIMEOUT, "the icon embedded", ignoring=Exception)

            # First run: a welcome naming the models folder, with a button that opens it.
            welcome = notifications.wait(lambda n: n["summary"] == "lmsp-tray is running", what="the welcome")
            assert "Put .gguf models in" in welcome["body"] and "lmsp/data/models" in welcome["body"]
            assert welcome["app"] == "lmsp-tray" and welcome["actions"] == ["open-folder", "Open models folder"]
            # No keyring here: said once, in a notification, with the whole text.
            keyring = notifications.wait(lambda n: n["summary"] == "lmsp-tray needs attention", what="keyring")
            assert (
                keyring["body"].startswith("Keyring unavailable: no keyring backend")
                and "owner-token" in keyring["body"]
            )

            # Hover text, and the idle icon (no model in memory).
            assert tray.menu()["tooltip"].startswith("lmsp-tray \u2014 ")
            tray.wait_icon_colour("desktop-idle-icon.png", "idle")

            # A left-click opens the console in the browser (through a private redirect file, so the
            # single-use code is on no command line); it never touches the clipboard.
            subprocess.run(["xclip", "-selection", "clipboard", "-in"], input=b"mine", env=x.env, timeout=10)
            x.click(window, 1)
            target = wait_until(
                lambda: opened.exists() and opened.read_text().split(),
                TIMEOUT,
                "the console opened",
                ignoring=Exception,
            )
            assert target[0].startswith("file://") and "#" not in target[0]
            redirect = Path(target[0].removeprefix("file://")).read_text()
            assert f"{url.removesuffix('/lmsp/v1')}/console/#" in redirect
            # A right-click opens the menu.
            x.click(window, 3)
            wait_until(
                lambda: tray.menu().get("open"), TIMEOUT, "the menu to open on a right-click", ignoring=Exception
            )
            assert wait_until(x.popup_windows, TIMEOUT, "the menu window", ignoring=Exception)
            x.screenshot("desktop-right-click-menu.png")
            x.keys("Escape")
            wait_until(lambda: not tray.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)
            held = subprocess.run(
                ["xclip", "-o", "-selection", "clipboard"], env=x.env, capture_output=True, timeout=10
            )
            assert held.stdout == b"mine"

            with api(tray, url) as client:
                # An open menu follows the state: a load through the API shows while it stays open.
                tray.open_menu()
                client.post(f"/models/{TINY_ID}/load").raise_for_status()
                status = tray.wait_item(url, check=lambda i: i["text"].endswith("1 of 2 models loaded"))
                assert tray.menu()["open"], "the menu closed instead of updating"
                tray.wait_item("Models", check=lambda i: i["text"] == "Models (1/2 loaded)")
                x.screenshot("desktop-open-menu-updated.png")
                x.keys("Escape")
                wait_until(lambda: not tray.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)
                assert status["text"] == f"{url} \u2014 1 of 2 models loaded"
                # Loaded and waiting: the "ready" icon, not the idle one.
                wait_until(
                    lambda: tray.menu().get("activity") == "ready", TIMEOUT, "the ready icon", ignoring=Exception
                )
                shot = tray.wait_icon_colour("desktop-ready-icon.png", "ready")
                assert colour_share(x, window, shot, "idle") == 0

                # A second launch (the launcher clicked again) opens the running one's console.
                before = len(opened.read_text().split())
                second = subprocess.run(
                    [*program(), "--models-dir", str(models_dir), "--no-default-dirs"],
                    env=tray.env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert second.returncode == 0 and f"already running at {url}" in second.stdout
                wait_until(
                    lambda: len(opened.read_text().split()) > before,
                    TIMEOUT,
                    "the console on a second launch",
                    ignoring=Exception,
                )

                # A pairing request: its own notification, with Approve/Deny; Approve works from there.
                asked = httpx.post(
                    f"{url}/auth/pairings", json={"app_name": "Notes App", "scopes": ["models:read"]}, timeout=30
                ).json()
                note = notifications.wait(lambda n: "Notes App" in n["summary"], what="the pairing notification")
                assert note["actions"] == ["approve", "Approve", "deny", "Deny"] and asked["user_code"] in note["body"]
                ids = [n["id"] for n in notifications.records()]
                assert len(ids) == len(set(ids)) and note["replaces"] == 0  # nothing replaced another
                notifications.invoke(note["id"], "approve")
                poll = {"Authorization": f"Bearer {asked['poll_token']}"}

                def approved() -> dict | None:
                    doc = httpx.get(f"{url}/auth/pairings/{asked['id']}", headers=poll, timeout=30).json()
                    return doc if doc["status"] == "approved" else None

                doc = wait_until(approved, TIMEOUT, "the pairing approved from the notification", ignoring=Exception)
                assert doc["token"].startswith("lmsp_")
                wait_until(
                    lambda: any(c["id"] == note["id"] for c in notifications.records("close")),
                    TIMEOUT,
                    "the answered request's notification closed",
                    ignoring=Exception,
                )

            tray.choose("Quit", closes=False)
            assert tray.wait_exit(60) == 0
        finally:
            tray.close()
    text = tray.output.read_text()
    assert "Traceback" not in text and "a second launch asked this instance to show itself" in log_text(tmp_path)


def test_no_tray_host_says_so_and_serves_then_shows_the_icon_when_a_tray_starts(
    tmp_path, models_dir, bus, notifications
):
    with XSession(tray_host=False) as x:
        tray = LiveTray(x, tmp_path, models_dir, bus.address)
        try:
            url = tray.url()
            text = tray.said("running headless without a tray icon", timeout=60)
            [line] = [ln for ln in text.splitlines() if "headless" in ln]
            assert line.startswith("lmsp-tray: no system tray is running on this desktop") and url in line
            assert "from the system tray" not in text  # never claims a tray it lacks
            note = notifications.wait(lambda n: n["summary"] == "lmsp-tray runs without a tray icon")
            assert "no system tray is running" in note["body"] and "AppIndicator" in note["body"]
            assert httpx.get(url, timeout=10).json()["object"] == "service"
            x.screenshot("desktop-no-tray-host.png")

            # A panel that starts late (at login, after us) still gets the icon.
            x.start_tray_host()
            tray.icon_window()
            tray.said("from the system tray (gtk)")
            x.screenshot("desktop-tray-host-late.png")
            tray.proc.send_signal(signal.SIGTERM)
            assert tray.wait_exit(60) == 0
        finally:
            tray.close()
    assert "Traceback" not in tray.output.read_text()


def test_the_xorg_icon_survives_non_latin1_text_and_says_it_has_no_menu(tmp_path, models_dir, bus, notifications):
    from Xlib import display as xdisplay

    with XSession() as x:
        tray = LiveTray(x, tmp_path, models_dir, bus.address, PYSTRAY_BACKEND="xorg")
        try:
            url = tray.url()
            window = tray.icon_window()
            text = tray.said("PYSTRAY_BACKEND=xorg: this icon has no menu; install PyGObject")  # said just after:
            assert "from the system tray (xorg). Click the icon for its state" in text

            def wm_name() -> str:
                d = xdisplay.Display(x.display_name)
                try:
                    return str(d.create_resource_object("window", window).get_wm_name())
                finally:
                    d.close()

            # The title names the URL once the tray's poll has seen the service (after service.json is written).
            name = wait_until(
                lambda: n if url in (n := wm_name()) else None, TIMEOUT, lambda: f"the URL in {wm_name()!r}"
            )
            assert name.startswith("lmsp-tray - ")  # the em dash, spelled for Latin-1
            # A click shows the state in a notification (there is no menu to open).
            x.click(window, 1)
            status = notifications.wait(lambda n: n["summary"] == "lmsp-tray", what="the status notification")
            assert status["body"].startswith(f"{url} \u2014 0 of 2 models loaded")
            x.screenshot("desktop-xorg-icon.png")
            stopped = subprocess.run([*program(), "stop"], env=tray.env, capture_output=True, text=True, timeout=60)
            assert stopped.returncode == 0
            assert tray.wait_exit(60) == 0
        finally:
            tray.close()
    text = tray.output.read_text()
    assert "latin-1" not in text and "Traceback" not in text


def _dbus_call(address: str, bus_name: str, path: str, interface: str, member: str, signature=None, body=()):
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    with open_dbus_connection(address) as conn:
        msg = new_method_call(DBusAddress(path, bus_name=bus_name, interface=interface), member, signature, body)
        return conn.send_and_get_reply(msg, timeout=10).body


def _labels(layout) -> list[str]:
    _id, props, children = layout
    out = [props["label"][1]] if "label" in props else []
    for child in children:
        out += _labels(child[1])
    return out


def _find(layout, label: str) -> int | None:
    item_id, props, children = layout
    if props.get("label", ("", ""))[1] == label:
        return item_id
    for child in children:
        found = _find(child[1], label)
        if found is not None:
            return found
    return None


def test_appindicator_where_a_status_notifier_watcher_runs(tmp_path, models_dir, bus, notifications):
    pytest.importorskip("gi")
    from lmsp_tray.desktop.toolkit import appindicator_available

    if not appindicator_available():
        pytest.skip("needs gir1.2-ayatanaappindicator3-0.1 (.ci/run installs it)")
    watcher = DBusFake(bus.address, "watcher", tmp_path / "watcher.jsonl")
    try:
        with XSession(tray_host=False) as x:  # no XEmbed tray: only the StatusNotifier path can show it
            tray = LiveTray(x, tmp_path, models_dir, bus.address)
            try:
                url = tray.url()
                tray.said("from the system tray (appindicator)")
                [registered] = wait_until(
                    lambda: [r for r in watcher.records() if r["call"] == "RegisterStatusNotifierItem"],
                    TIMEOUT,
                    "the item to register with the watcher",
                    ignoring=Exception,
                )
                item = registered["arg"]
                name, path = (registered["sender"], item) if item.startswith("/") else (item, "/StatusNotifierItem")
                props = "org.freedesktop.DBus.Properties"
                sni = "org.kde.StatusNotifierItem"
                title = _dbus_call(bus.address, name, path, props, "Get", "ss", (sni, "Title"))[0][1]
                menu_path = _dbus_call(bus.address, name, path, props, "Get", "ss", (sni, "Menu"))[0][1]
                assert title.startswith("lmsp-tray \u2014 ")

                def layout():
                    return _dbus_call(
                        bus.address, name, menu_path, "com.canonical.dbusmenu", "GetLayout", "iias", (0, -1, [])
                    )[1]

                labels = wait_until(
                    lambda: _labels(layout()) if len(_labels(layout())) > 5 else None,
                    TIMEOUT,
                    "menu",
                    ignoring=Exception,
                )
                assert f"{url} \u2014 0 of 2 models loaded" in labels and "Quit" in labels and "View logs" in labels
                assert any(label.startswith(TINY_ID) for label in labels)
                # The panel's click on a model, over D-Bus: it loads.
                model = next(label for label in labels if label.startswith(SLOW_ID))
                _dbus_call(
                    bus.address,
                    name,
                    menu_path,
                    "com.canonical.dbusmenu",
                    "Event",
                    "isvu",
                    (_find(layout(), model), "clicked", ("s", ""), 0),
                )
                with api(tray, url) as client:
                    wait_until(
                        lambda: client.get(f"/models/{SLOW_ID}").json()["state"] == "loaded",
                        60,
                        "the model loaded from the indicator's menu",
                        ignoring=Exception,
                    )
                # ... and the exported menu follows (no snapshot): the status line says so.
                wait_until(
                    lambda: f"{url} \u2014 1 of 2 models loaded" in _labels(layout()),
                    TIMEOUT,
                    "the menu to update",
                    ignoring=Exception,
                )
                quit_id = _find(layout(), "Quit")
                _dbus_call(
                    bus.address,
                    name,
                    menu_path,
                    "com.canonical.dbusmenu",
                    "Event",
                    "isvu",
                    (quit_id, "clicked", ("s", ""), 0),
                )
                assert tray.wait_exit(60) == 0
            finally:
                tray.close()
    finally:
        watcher.stop()
    assert "Traceback" not in tray.output.read_text()


def test_backend_choice(monkeypatch):
    """Which backend for which desktop (the parts that probe the session are replaced)."""
    from lmsp_tray.desktop import toolkit

    def choose(env, *, gi=None, watcher=(False, False), x11=(True, True), indicator=True):
        monkeypatch.setattr(toolkit, "ensure_gi", lambda *_: gi)
        monkeypatch.setattr(toolkit, "sni_watcher", lambda *_: watcher)
        monkeypatch.setattr(toolkit, "x11_tray", lambda d: x11 if d else (False, False))
        monkeypatch.setattr(toolkit, "appindicator_available", lambda: indicator)
        return toolkit.choose_backend(env, "linux")

    x = {"DISPLAY": ":0"}
    assert choose(x, watcher=(True, True)).name == "appindicator"  # KDE, GNOME with the extension
    assert choose(x).name == "gtk"  # XFCE, MATE, trayer
    late = choose(x, x11=(True, False))
    assert late.name == "gtk" and not late.host_seen  # icon made; reported if not embedded soon
    assert choose(x, watcher=(True, False), x11=(True, True)).name == "gtk"  # a watcher with no host shows nothing
    wayland = choose({"WAYLAND_DISPLAY": "wayland-0"}, x11=(False, False))
    assert wayland.name is None and "no system tray is running" in (wayland.reason or "")
    assert choose({"WAYLAND_DISPLAY": "w"}, watcher=(True, True)).name == "appindicator"
    no_gi = choose(x, gi="PyGObject (the Python module gi) is not installed for this Python")
    assert no_gi.name == "xorg" and "no menu" in (no_gi.note or "") and "python3-gi" in (no_gi.note or "")
    dead = choose({"DISPLAY": ":9"}, x11=(False, False))
    assert dead.name is None and dead.reason == "the X display :9 does not answer"
    assert toolkit.choose_backend({"PYSTRAY_BACKEND": "dummy"}, "linux").name == "dummy"
    assert toolkit.choose_backend({}, "win32").name == ""


def test_the_distributions_pygobject_is_used_when_it_fits(tmp_path):
    """A venv without PyGObject (the README's plain pip install) borrows python3-gi if built for it."""
    if not Path("/usr/lib/python3/dist-packages/gi/__init__.py").is_file():
        pytest.skip("no python3-gi here")
    code = (
        "import sys, importlib.abc\n"
        "class NoGi(importlib.abc.MetaPathFinder):\n"  # as if the venv had no PyGObject
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gi' and 'gi' not in sys.modules: raise ImportError('no gi')\n"
        "sys.meta_path.insert(0, NoGi())\n"
        "from lmsp_tray.desktop.toolkit import ensure_gi\n"
        "print(ensure_gi())\n"
        "import gi; print(gi.__file__)\n"
        "gi.require_version('Gtk', '3.0')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    import importlib.machinery

    fits = Path(f"/usr/lib/python3/dist-packages/gi/_gi{importlib.machinery.EXTENSION_SUFFIXES[0]}").is_file()
    if fits:
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["None", "/usr/lib/python3/dist-packages/gi/__init__.py"]
    else:
        assert "is not installed for this Python" in out.stdout
