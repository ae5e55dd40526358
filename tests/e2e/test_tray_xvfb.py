"""The real tray under Xvfb with the trayer tray host and pystray's gtk backend.

Each test starts `tests/tray_runner.py` (the real `TrayApp` over a scripted
test backend) in its own process, finds the icon that trayer embedded,
right-clicks it with xdotool, walks the real Gtk menu with the keyboard and
checks what happened: the backend's event log, the widgets' own labels and
check marks (dumped by the runner), the icon's pixels in screenshots, the
clipboard as another X client reads it, and notifications received by a
real D-Bus notification server. Screenshots go to `test-artifacts/`.

The scripted backend makes states that are hard to hold still with a real
daemon (a load that waits, a pairing request, a token) deterministic; the
real program over the real daemon is driven the same way in
test_tray_daemon_xvfb.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import json_lines, wait_until
from tray_driver import TIMEOUT, TrayProcess, as_shown, shown
from xvfb import ROOT, XSession, missing_tools, spec_keys

from lmsp_tray.desktop.menu import ModelView, TrayState, build_menu

pytestmark = [pytest.mark.xvfb, pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())}")]

URL = "http://127.0.0.1:7373/lmsp/v1"
SECRET = "lmsp_sk_TEST_0123456789abcdefSECRET"
MODELS = [
    {"id": "tiny-a", "size_bytes": 524_288, "quantization": "F32"},
    {"id": "gemma-3:270m-q4_k_m", "size_bytes": 253_112_000, "quantization": "Q4_K_M"},
    {"id": "broken", "size_bytes": 1200},
]


@pytest.fixture(scope="module")
def xsession():
    try:
        import gi  # noqa: F401
    except ImportError:
        pytest.skip("needs PyGObject")
    with XSession() as session:
        yield session


class Tray(TrayProcess):
    """tests/tray_runner.py: the real TrayApp over a scripted backend."""

    def __init__(self, x: XSession, tmp: Path, *, bus: str, gate: bool = False) -> None:
        state_dir = tmp / "state"
        state_dir.mkdir()
        self.home = tmp / "home"
        self.home.mkdir()
        setup = {
            "url": URL,
            "token": SECRET,
            "gate": gate,
            "models": MODELS,
            "fail": {"broken": "not a GGUF file (bad magic b'PK\\x03\\x04')\nTraceback: should not show"},
        }
        (state_dir / "setup.json").write_text(json.dumps(setup))
        env = x.env
        env.update(PYSTRAY_BACKEND="gtk", HOME=str(self.home), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        env.pop("XDG_CONFIG_HOME", None)
        runner = [sys.executable, str(ROOT / "tests" / "tray_runner.py"), str(state_dir)]
        self.notifications = state_dir / "notifications.jsonl"
        if bus == "none":
            env["DBUS_SESSION_BUS_ADDRESS"] = "disabled:"
            argv = runner
        else:
            env.pop("DBUS_SESSION_BUS_ADDRESS", None)
            script = 'exec "$@"'
            if bus == "notifications":
                script = (
                    '"$0" tests/notify_server.py "$NOTIFY_OUT" & '
                    'while [ ! -e "$NOTIFY_OUT.ready" ]; do sleep 0.05; done; exec "$@"'
                )
                env["NOTIFY_OUT"] = str(self.notifications)
            argv = ["dbus-run-session", "--", "sh", "-c", script, sys.executable, *runner]
        super().__init__(x, state_dir, argv, env, ROOT)


@pytest.fixture
def tray_factory(xsession, tmp_path):
    trays: list[Tray] = []

    def start(**kwargs) -> Tray:
        tray = Tray(xsession, tmp_path, **kwargs)
        trays.append(tray)
        return tray

    yield start
    for tray in trays:
        tray.close()
        if tray.output.exists():
            print(f"--- tray output ---\n{tray.output.read_text()[-3000:]}")


def test_icon_appears_menu_opens_click_loads_and_unloads_quit_exits_0(tray_factory, xsession):
    # A session bus without a notification daemon: the pystray clean-up gotcha is on this path.
    tray = tray_factory(bus="session", gate=True)
    window = tray.icon_window()
    print(f"icon embedded after {time.monotonic() - tray.started:.2f} s")
    wait_until(lambda: tray.menu().get("embedded"), TIMEOUT, "Gtk to report the icon embedded", ignoring=Exception)
    assert tray.menu()["toolkit"] == "gtk"
    geo = xsession.geometry(window)
    assert geo.width >= 16 and geo.height >= 16
    tray.wait_icon_colour("tray-icon-idle.png", "idle")  # the idle (blue) icon, visible in the tray
    status = tray.wait_item(URL)
    assert status["text"] == f"{URL} \u2014 0 of 3 models loaded"
    # The Gtk menu is exactly the pure model's menu for this state.
    expected = build_menu(
        TrayState(
            url=URL,
            models=tuple(ModelView(m["id"], m["size_bytes"], m.get("quantization")) for m in MODELS),
            token_available=True,
        )
    )
    assert shown(tray.menu()["items"]) == as_shown(expected)
    assert tray.keys_to("Models", "tiny-a") == spec_keys(expected, "Models", "tiny-a")

    tray.open_menu()
    assert xsession.popup_windows()[0].width > 150
    xsession.screenshot("tray-menu-open.png")
    xsession.keys("Escape")
    wait_until(lambda: not tray.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)

    # Click the model: it loads (on a worker thread, showing "Loading…" and the loading icon).
    tray.choose("Models", "tiny-a", screenshot="tray-menu-models.png")
    start = tray.wait_event("load_start", "tiny-a")
    assert start["thread"].startswith("tray-"), "a model load ran on the GUI thread"
    loading = tray.wait_item("Models", "tiny-a", check=lambda i: i["text"].endswith("Loading\u2026"))
    assert loading["sensitive"] is False
    tray.show("Models", screenshot="tray-menu-loading.png")
    wait_until(lambda: tray.menu().get("activity") == "loading", TIMEOUT, "the loading icon", ignoring=Exception)
    tray.wait_icon_colour("tray-icon-loading.png", "loading")
    (tray.dir / "release-tiny-a").write_text("go")
    tray.wait_event("load_done", "tiny-a")
    loaded = tray.wait_item("Models", "tiny-a", check=lambda i: i["checked"] is True, what="tiny-a checked")
    assert loaded["text"] == "tiny-a \u00b7 524 KB \u00b7 F32"
    assert tray.item(URL[:20])["text"].endswith("1 of 3 models loaded")
    assert tray.item("Unload all")["sensitive"] is True

    # Click it again: it unloads.
    tray.choose("Models", "tiny-a", screenshot="tray-menu-loaded.png")
    tray.wait_event("unload", "tiny-a")
    tray.wait_item("Models", "tiny-a", check=lambda i: i["checked"] is False, what="tiny-a unchecked")

    tray.choose("Quit", closes=False)  # the process ends: no more menu dumps
    assert tray.wait_exit() == 0
    assert [e["event"] for e in tray.events()][-2:] == ["quit", "exit"]
    assert "Traceback" not in tray.output.read_text()


def test_failed_load_shows_the_reason_and_the_error_icon(tray_factory, xsession):
    tray = tray_factory(bus="none")  # no D-Bus at all: the tray must still work
    tray.icon_window()
    tray.wait_item(URL)
    tray.choose("Models", "broken")
    tray.wait_event("load_failed", "broken")
    item = tray.wait_item("Models", "broken", check=lambda i: "could not load" in i["text"])
    assert item["text"] == "broken \u00b7 1.2 KB \u2014 \u26a0 could not load"
    # The whole reason one level down (a traceback never), then "Try again", which loads again.
    lines = [i["text"] for i in item["submenu"] if not i.get("separator")]
    assert lines == ["not a GGUF file (bad magic b'PK\\x03\\x04')", "Try again"]
    notice = tray.wait_item("\u26a0 Could not load broken")
    assert notice["text"] == "\u26a0 Could not load broken: not a GGUF file (bad magic b'PK\\x03\\x04')"  # whole
    wait_until(lambda: tray.menu().get("activity") == "error", TIMEOUT, "the error icon", ignoring=Exception)
    tray.wait_icon_colour("tray-icon-error.png", "error")
    tray.open_menu()
    xsession.screenshot("tray-menu-error.png")
    xsession.keys("Escape")
    wait_until(lambda: not tray.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)
    # SIGTERM (logout, systemd stop) ends the loop cleanly too.
    tray.choose("Models", "broken", "Try again")
    wait_until(
        lambda: len([e for e in tray.events() if e["event"] == "load_failed"]) == 2,
        TIMEOUT,
        "a retry",
        ignoring=Exception,
    )
    tray.proc.send_signal(signal.SIGTERM)
    assert tray.wait_exit() == 0
    written = tray.text_written()
    assert "Traceback" not in written and "should not show" not in tray.menu().__repr__()


def test_api_changes_pairing_token_and_start_at_login(tray_factory, xsession):
    tray = tray_factory(bus="notifications")
    tray.icon_window()
    tray.wait_item(URL)

    # Changes made through the API show up without touching the menu.
    changed = time.monotonic()
    # Whole or not at all (os.replace): the runner's poll reads the file when its mtime changes, and an
    # empty file caught between the truncation and the write, of the same mtime, would never be read again.
    (tray.dir / "control.json.tmp").write_text(
        json.dumps(
            {
                "model_states": {"gemma-3:270m-q4_k_m": "loaded"},
                "generating": {"gemma-3:270m-q4_k_m": True},
                "pairings": [
                    {
                        "id": "pair_01",
                        "app_name": "Notes\napp",
                        "scopes": ["models:read", "responses:create"],
                        "user_code": "WDJB-MJHT",
                    }
                ],
            }
        )
    )
    os.replace(tray.dir / "control.json.tmp", tray.dir / "control.json")
    entry = tray.wait_item("\u201cNotes app\u201d")
    print(f"menu followed an API change after {time.monotonic() - changed:.2f} s")
    assert entry["text"] == "\u201cNotes app\u201d \u2014 code WDJB-MJHT"
    assert [i.get("text") for i in entry["submenu"] if not i.get("separator")] == [
        "App: Notes app",
        "Code: WDJB-MJHT",
        "Scopes: models:read, responses:create",
        "Approve",
        "Deny",
    ]
    gemma = tray.wait_item("Models", "gemma-3", check=lambda i: i["checked"] is True)
    assert gemma["text"].endswith("\u2014 generating")
    wait_until(lambda: tray.menu().get("activity") == "serving", TIMEOUT, "the serving icon", ignoring=Exception)
    tray.wait_icon_colour("tray-icon-serving.png", "serving")

    tray.choose("\u201cNotes app\u201d", "Approve", screenshot="tray-menu-pairing.png")
    tray.wait_event("approve_pairing", "pair_01")
    wait_until(lambda: tray.item("\u201cNotes") is None, TIMEOUT, "the request to leave the menu", ignoring=Exception)

    # Copy access token: the secret reaches the clipboard (read by another X client), nothing else.
    tray.choose("Copy access token")
    tray.wait_event("access_token")
    reader = (
        "import gi; gi.require_version('Gtk', '3.0'); gi.require_version('Gdk', '3.0');"
        "from gi.repository import Gtk, Gdk;"
        "print(Gtk.Clipboard.get(Gdk.SELECTION_CLIPBOARD).wait_for_text() or '', end='')"
    )

    # The backend records the call before the tray puts the secret on the clipboard and then says so.
    def clipboard() -> str:
        return subprocess.run(
            [sys.executable, "-c", reader], env=xsession.env, capture_output=True, text=True, timeout=TIMEOUT
        ).stdout

    wait_until(
        lambda: clipboard() == SECRET,
        TIMEOUT,
        lambda: f"the secret on the clipboard, not {clipboard()!r}",
        interval=0.1,
    )
    wait_until(  # the pairing's approval was notified before: wait for this one
        lambda: any(n["summary"] == "Access token copied to the clipboard" for n in json_lines(tray.notifications)),
        TIMEOUT,
        "the notification that the token was copied",
        ignoring=Exception,
    )

    # Start at login: the checkbox writes and removes the real XDG autostart file.
    desktop = tray.home / ".config" / "autostart" / "lmsp-tray.desktop"
    assert tray.item("Start at login")["checked"] is False and not desktop.exists()
    tray.choose("Start at login")
    tray.wait_event("set_autostart", True)
    assert desktop.is_file() and "Exec=" in desktop.read_text()
    tray.wait_item("Start at login", check=lambda i: i["checked"] is True)
    tray.choose("Start at login")
    tray.wait_event("set_autostart", False)
    assert not desktop.exists()
    tray.wait_item("Start at login", check=lambda i: i["checked"] is False)

    tray.choose("Quit", closes=False)  # the process ends: no more menu dumps
    assert tray.wait_exit() == 0
    notes = json_lines(tray.notifications)
    assert all(SECRET not in n["summary"] + n["body"] for n in notes)
    assert SECRET not in tray.text_written()
    assert "Traceback" not in tray.output.read_text()
