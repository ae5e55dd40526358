"""Logic around the tray, without a display: display detection, the clipboard fallback chain,
spec -> pystray menu translation, and how TrayApp refreshes, dispatches clicks and survives failures.

The icon here is a recording stand-in; the real icon, menu and clicks are tested under Xvfb in
test_tray_xvfb.py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
from support import ROOT, wait_until

from lmsp_tray.desktop.menu import Action, ModelView, PairingView, TrayState, build_menu
from lmsp_tray.desktop.system import (
    Clipboard,
    ClipboardError,
    OpenError,
    display_available,
    headless_message,
    open_folder,
)
from lmsp_tray.desktop.tray import TrayApp, TrayUnavailable, default_icon_size, gtk_status_icon_size, pystray_menu
from lmsp_tray.errors import ModelLoadFailed

URL = "http://127.0.0.1:7373/lmsp/v1"


@pytest.fixture(scope="module")
def pystray_pure():
    """pystray's Menu/MenuItem (pure classes); the dummy backend so no display is needed to import."""
    if "pystray" not in sys.modules:
        old = os.environ.get("PYSTRAY_BACKEND")
        os.environ["PYSTRAY_BACKEND"] = "dummy"
        try:
            import pystray  # noqa: F401
        finally:
            if old is None:
                os.environ.pop("PYSTRAY_BACKEND", None)
            else:
                os.environ["PYSTRAY_BACKEND"] = old
    return sys.modules["pystray"]


class RecordingIcon:
    """Stands in for pystray.Icon: records what TrayApp asks of it."""

    HAS_NOTIFICATION = True

    def __init__(self, name, icon=None, title=None, menu=None):
        self.icon, self.title, self.menu = icon, title, menu
        self.menu_updates = 0
        self.notes: list[str] = []
        self.stopped = threading.Event()
        self.run_error: Exception | None = None
        self.on_run = None

    def update_menu(self):
        self.menu_updates += 1

    def notify(self, message, title=None):
        self.notes.append(f"{title}: {message}")

    def stop(self):
        self.stopped.set()

    def run(self, setup=None):
        setup(self)
        if self.on_run:
            self.on_run()
        self.stopped.wait(30)
        if self.run_error:
            raise self.run_error


def fake_pystray(pure) -> types.SimpleNamespace:
    return types.SimpleNamespace(Icon=RecordingIcon, Menu=pure.Menu, MenuItem=pure.MenuItem)


class Backend:
    def __init__(self):
        self.state = TrayState(url=URL, models=(ModelView("a", 10, "Q4_0"),), token_available=True)
        self.calls: list[tuple] = []
        self.fail: dict[str, Exception] = {}
        self.token = "lmsp_sk_SECRET"
        self.folder = None

    def _call(self, name, *args):
        self.calls.append((name, *args))
        if name in self.fail:
            raise self.fail[name]

    def snapshot(self):
        self._call("snapshot")
        return self.state

    def load_model(self, model_id):
        self._call("load_model", model_id)

    def unload_model(self, model_id):
        self._call("unload_model", model_id)

    def unload_all(self):
        self._call("unload_all")

    def rescan(self):
        self._call("rescan")

    def models_folder(self):
        return self.folder

    def open_console(self):
        self._call("open_console")

    def access_token(self):
        self._call("access_token")
        return self.token

    def set_autostart(self, enabled):
        self._call("set_autostart", enabled)

    def approve_pairing(self, pid):
        self._call("approve_pairing", pid)

    def deny_pairing(self, pid):
        self._call("deny_pairing", pid)

    def quit(self):
        self._call("quit")


class MemoryClipboard:
    def __init__(self):
        self.text = None

    def copy(self, text):
        self.text = text
        return "memory"


@pytest.fixture
def app(pystray_pure, tmp_path):
    backend = Backend()
    backend.folder = tmp_path / "models"
    opened = []
    app = TrayApp(
        backend,
        pystray=fake_pystray(pystray_pure),
        clipboard=MemoryClipboard(),
        opener=opened.append,
        handle_signals=False,
    )
    app.opened = opened
    return app


# -- display ---------------------------------------------------------------------------------------


def test_display_available():
    assert display_available({}, "linux") is False
    assert display_available({"DISPLAY": ":0"}, "linux") is True
    assert display_available({"WAYLAND_DISPLAY": "wayland-0"}, "linux") is True
    assert display_available({"DISPLAY": ""}, "freebsd") is False
    assert display_available({}, "darwin") is True and display_available({}, "win32") is True


def test_headless_message_is_one_clear_line():
    msg = headless_message(URL)
    assert "\n" not in msg and "no display" in msg and "headless" in msg and URL in msg


def test_no_display_means_tray_unavailable_not_a_traceback():
    """A fresh process without DISPLAY: importing pystray fails; load_pystray says so in one line."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "PYSTRAY_BACKEND")}
    env["PYTHONPATH"] = str(ROOT)
    code = (
        "from lmsp_tray.desktop.tray import load_pystray, TrayUnavailable\n"
        "try:\n    load_pystray()\nexcept TrayUnavailable as e:\n    print('UNAVAILABLE', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("UNAVAILABLE the system tray is not available (")
    assert "Traceback" not in out.stderr


def test_icon_sizes():
    assert [gtk_status_icon_size(s) for s in (10, 16, 22, 24, 30, 38, 47, 64)] == [16, 16, 16, 24, 24, 32, 32, 48]
    assert default_icon_size("gtk") == 24 and default_icon_size("win32") == 32


# -- clipboard -------------------------------------------------------------------------------------


def test_clipboard_tools_in_order_and_secret_on_stdin_only():
    runs = []

    def run(argv, **kw):
        runs.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0)

    board = Clipboard(
        environ={"DISPLAY": ":0"}, platform="linux", which=lambda t: f"/usr/bin/{t}" if t == "xsel" else None, run=run
    )
    assert board.copy("s3cret") == "xsel"
    ((argv, kw),) = runs
    assert argv == ["/usr/bin/xsel", "--clipboard", "--input"] and kw["input"] == b"s3cret"
    assert all("s3cret" not in a for a in argv)
    assert [c[0] for c in Clipboard(environ={"WAYLAND_DISPLAY": "w"}, platform="linux").commands()] == [
        "wl-copy",
        "xclip",
        "xsel",
    ]
    assert Clipboard(platform="darwin").commands() == [["pbcopy"]]
    assert Clipboard(platform="win32").commands() == [["clip"]]


def test_clipboard_falls_through_failing_tools_and_reports_none_found():
    def run(argv, **kw):
        if argv[0].endswith("xclip"):
            raise subprocess.CalledProcessError(1, argv)
        return subprocess.CompletedProcess(argv, 0)

    board = Clipboard(environ={}, platform="linux", which=lambda t: f"/bin/{t}", run=run)
    assert board.copy("x") == "xsel"
    with pytest.raises(ClipboardError, match="install one of: xclip, xsel"):
        Clipboard(environ={}, platform="linux", which=lambda t: None).copy("x")


@pytest.mark.xvfb
def test_real_clipboard_tool_on_a_real_display(monkeypatch):
    """xclip (installed by .ci/run) on a private Xvfb: what we copy is what the clipboard holds."""
    from xvfb import XSession

    with XSession() as x:
        monkeypatch.setenv("DISPLAY", x.display_name)
        monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
        board = Clipboard(environ={"DISPLAY": x.display_name}, platform="linux")
        assert board.copy("lmsp clipboard check") == "xclip"
        held = subprocess.run(
            ["xclip", "-o", "-selection", "clipboard"], env=x.env, capture_output=True, text=True, timeout=10
        )
        assert held.stdout == "lmsp clipboard check"


def test_open_folder_runs_the_file_manager_or_says_where_it_is(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    with pytest.raises(
        OpenError, match="tried gio, xdg-open, the FileManager1 D-Bus service.* the folder is /srv/models$"
    ):
        open_folder(Path("/srv/models"), platform="linux")
    record = tmp_path / "opened.txt"
    tool = bindir / "xdg-open"
    tool.write_text(f"#!/bin/sh\nprintf '%s' \"$1\" > '{record}'\n")
    tool.chmod(0o755)
    open_folder(tmp_path / "my models", platform="linux")
    # The shell creates the file before printf writes to it: wait for what it says, not for the file.
    opened = wait_until(lambda: record.exists() and record.read_text(), 10, "xdg-open to write what it opened")
    assert opened == str(tmp_path / "my models")


# -- menu translation ------------------------------------------------------------------------------


def test_pystray_menu_mirrors_the_specs(pystray_pure):
    state = TrayState(
        url=URL,
        models=(ModelView("a", 10, None, "loaded"), ModelView("b", 20)),
        pairings=(PairingView("p1", "App & Co", ("models:read",), "AB-CD"),),
        token_available=True,
    )
    clicks = []
    menu = pystray_menu(pystray_pure, build_menu(state), lambda a, arg: clicks.append((a, arg)))
    items = list(menu)
    texts = [i.text for i in items if i is not pystray_pure.Menu.SEPARATOR]
    assert texts[0].startswith(URL) and texts[-1] == "Quit"
    assert [i.text for i in items if i.default] == ["Open lmsp-tray"]  # the one default item
    models = next(i for i in items if i.text.startswith("Models")).submenu
    a, b = list(models)
    assert (a.checked, b.checked) == (True, False)
    a(None)
    b(None)
    pairing = next(i for i in items if i.text.startswith("\u201cApp & Co"))
    approve = next(i for i in pairing.submenu if i.text == "Approve")
    approve(None)
    assert clicks == [(Action.UNLOAD_MODEL, "a"), (Action.LOAD_MODEL, "b"), (Action.APPROVE_PAIRING, "p1")]
    labels = [i for i in pairing.submenu if i.text.startswith("App:")]
    assert labels[0].enabled is False
    escaped = pystray_menu(pystray_pure, build_menu(state), lambda *_: None, escape_ampersand=True)
    assert any(i.text.startswith("\u201cApp && Co") for i in escaped)


# -- the app ---------------------------------------------------------------------------------------


def test_initial_state_icon_and_tooltip(app):
    assert app.state.url == URL and app.icon.title.startswith("lmsp-tray \u2014 ready")
    assert app.icon.icon.size == (22, 22)
    assert [i.text for i in app.icon.menu.items][-1] == "Quit"


def test_poll_updates_only_on_change_and_switches_the_icon(app):
    backend = app.backend
    assert app.poll_once() is False and app.icon.menu_updates == 0
    first_image = app.icon.icon
    backend.state = TrayState(url=URL, models=(ModelView("a", 10, "Q4_0", "loading"),), token_available=True)
    assert app.poll_once() is True and app.icon.menu_updates == 1
    assert app.icon.icon is not first_image and "loading" in app.icon.title
    assert "Loading\u2026" in next(i for i in app.icon.menu.items if i.text.startswith("Models")).submenu.items[0].text


def test_clicks_run_off_the_gui_thread(app):
    seen = []
    done = threading.Event()
    app.backend.load_model = lambda mid: (seen.append(threading.current_thread().name), done.set())
    app.click(Action.LOAD_MODEL, "a")
    assert done.wait(10)
    assert seen[0].startswith("tray-") and seen[0] != threading.current_thread().name


def test_failed_action_becomes_notice_notification_and_error_icon(app):
    app.backend.fail["load_model"] = ModelLoadFailed("out of memory: needs 9 GB\nmore detail")
    app.perform(Action.LOAD_MODEL, "a")
    assert app.icon.notes == ["Could not load a: out of memory: needs 9 GB more detail"]  # the whole text
    app.poll_once()
    whole = "Could not load a: out of memory: needs 9 GB more detail"
    assert app.state.activity == "error" and app.state.notice == whole
    assert build_menu(app.state)[1].text == f"\u26a0 {whole}"
    del app.backend.fail["load_model"]
    app.perform(Action.LOAD_MODEL, "a")  # a success clears it
    app.poll_once()
    assert app.state.activity != "error" and app.state.notice is None
    assert app.icon.notes[-1] == "Loaded a: It answers requests now."


def test_a_folder_that_will_not_open_is_a_notification_not_a_red_icon(app):
    def refuse(path):
        raise OpenError(f"no file manager answered (tried gio, xdg-open); the folder is {path}")

    app.opener = refuse
    app.perform(Action.OPEN_MODELS_FOLDER)
    expected = f"no file manager answered (tried gio, xdg-open); the folder is {app.backend.folder}"
    assert app.icon.notes == [f"Could not open the models folder: {expected}"]
    app.poll_once()
    assert app.state.activity != "error" and app.state.notice is None  # the path is in the notification, whole


def test_snapshot_failure_is_shown_not_raised(app):
    app.backend.fail["snapshot"] = ConnectionError("connection refused")
    assert app.poll_once() is True
    assert app.state.activity == "error" and app.state.notice == "service not answering: connection refused"
    assert app.state.url == URL  # the last good state stays


def test_each_action_calls_the_backend(app):
    app.perform(Action.UNLOAD_MODEL, "a")
    app.perform(Action.UNLOAD_ALL)
    app.perform(Action.RESCAN)
    app.perform(Action.SET_AUTOSTART, "on")
    app.perform(Action.SET_AUTOSTART, "off")
    app.perform(Action.APPROVE_PAIRING, "p1")
    app.perform(Action.DENY_PAIRING, "p2")
    app.perform(Action.OPEN_CONSOLE)
    calls = [c for c in app.backend.calls if c[0] != "snapshot"]
    assert calls == [
        ("unload_model", "a"),
        ("unload_all",),
        ("rescan",),
        ("set_autostart", True),
        ("set_autostart", False),
        ("approve_pairing", "p1"),
        ("deny_pairing", "p2"),
        ("open_console",),
    ]
    assert "Rescanned the models folders: Found 1 model." in app.icon.notes


def test_open_models_folder_creates_it(app):
    app.perform(Action.OPEN_MODELS_FOLDER)
    assert app.opened == [app.backend.folder] and app.backend.folder.is_dir()


def test_copy_token_goes_to_the_clipboard_only(app, caplog):
    caplog.set_level("DEBUG")
    app.perform(Action.COPY_TOKEN)
    assert app.clipboard.text == "lmsp_sk_SECRET"
    assert app.icon.notes[0].startswith("Access token copied to the clipboard: Paste it into your app")
    assert "until lmsp-tray stops" not in app.icon.notes[0]
    assert "lmsp_sk_SECRET" not in caplog.text and all("SECRET" not in n for n in app.icon.notes)
    app.backend.token = None
    app.perform(Action.COPY_TOKEN)
    assert app.icon.notes[-1] == "Could not copy the access token: there is no access token yet"


def test_a_session_only_token_says_it_dies_with_this_run(app):
    app.backend.state = dataclasses.replace(app.backend.state, token_session_only=True)
    app.poll_once()
    app.perform(Action.COPY_TOKEN)
    assert "It works until lmsp-tray stops, because the OS keyring cannot keep it." in app.icon.notes[-1]


def test_copy_url(app):
    app.perform(Action.COPY_URL)
    assert app.clipboard.text == URL


def test_quit_stops_the_loop_then_tells_the_backend(app):
    app.icon.on_run = lambda: app.click(Action.QUIT)
    assert app.run() == 0
    assert app.quit_requested and app.backend.calls[-1] == ("quit",)


def test_error_while_the_loop_ends_is_ignored(app):
    """pystray on gtk raises GLib.Error from notification clean-up after stop(); run() still returns 0."""
    app.icon.run_error = RuntimeError("GDBus.Error:org.freedesktop.DBus.Error.ServiceUnknown")
    app.icon.on_run = lambda: app.stop()
    assert app.run() == 0
    assert not app.quit_requested and ("quit",) not in app.backend.calls


def test_loop_failing_on_its_own_is_tray_unavailable(app):
    app.icon.run_error = RuntimeError("cannot open display")
    app.icon.stopped.set()
    with pytest.raises(TrayUnavailable, match="cannot open display"):
        app.run()
