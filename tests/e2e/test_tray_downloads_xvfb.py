"""The real `lmsp-tray` under Xvfb shows a download's progress in its menu and notifies when it ends.

The program runs as a user starts it (bare `lmsp-tray`, default folders of a
temporary home, HF_ENDPOINT at the local fake Hub) inside its own D-Bus
session with `tests/notify_server.py` recording notifications. A pull started
through the API appears in the Gtk menu (read through tests/probe_site's menu
dump) with its percentage while the fake Hub holds the file half-sent; when the
file arrives the menu line goes, the model is in the Models submenu and a
notification says it is ready; a corrupted download notifies its failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from hub_server import FakeHub
from hub_support import TINY, fake_hub, hub  # noqa: F401
from support import cli_token, json_lines, wait_until
from tray_driver import TIMEOUT, TrayProcess
from xvfb import ROOT, XSession, missing_tools

pytestmark = [
    pytest.mark.xvfb,
    pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())}"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def xsession():
    try:
        import gi  # noqa: F401
    except ImportError:
        pytest.skip("needs PyGObject")
    with XSession(width=1280, height=720) as session:
        yield session


def program() -> list[str]:
    script = Path(sys.executable).parent / "lmsp-tray"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lmsp_tray"]


class DownloadTray(TrayProcess):
    def __init__(self, x: XSession, tmp: Path, hub: FakeHub) -> None:
        home = tmp / "home"
        home.mkdir()
        lmsp_home = tmp / "lmsp"
        (lmsp_home / "config").mkdir(parents=True)
        (lmsp_home / "config" / "config.toml").write_text("demo_model = false\n")
        self.discovery_file = lmsp_home / "run" / "service.json"
        self.notifications = tmp / "notifications.jsonl"
        env = x.env
        for name in (
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
            "XDG_RUNTIME_DIR",
            "XDG_CACHE_HOME",
            "DBUS_SESSION_BUS_ADDRESS",
        ):
            env.pop(name, None)
        for name in [k for k in env if k.startswith(("HF_", "HUGGING"))]:
            env.pop(name)
        env.update(
            PYSTRAY_BACKEND="gtk",
            HOME=str(home),
            LMSP_TRAY_HOME=str(lmsp_home),
            PYTHONUNBUFFERED="1",
            HF_HOME=str(home / "hf"),
            HF_ENDPOINT=hub.endpoint,
            OLLAMA_MODELS=str(home / "ollama"),
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "probe_site")]),
            LMSP_TRAY_PROBE_DIR=str(tmp / "probe"),
            PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring",
            NOTIFY_OUT=str(self.notifications),
        )
        self.token = cli_token(program(), env, "models:read", "models:manage", "tasks:read", cwd=ROOT)
        script = (
            '"$0" tests/notify_server.py "$NOTIFY_OUT" & '
            'while [ ! -e "$NOTIFY_OUT.ready" ]; do sleep 0.05; done; exec "$@"'
        )
        argv = ["dbus-run-session", "--", "sh", "-c", script, sys.executable, *program(), "--port", "0"]
        super().__init__(x, tmp / "probe", argv, env, ROOT)

    def url(self) -> str:
        def read() -> str | None:
            assert self.proc.poll() is None, self.output.read_text()
            try:
                return json.loads(self.discovery_file.read_text())["url"]
            except (OSError, ValueError, KeyError):
                return None

        return wait_until(read, 120, "service.json", ignoring=Exception)

    def notified(self) -> list[str]:
        return [
            " ".join(str(note.get(k, "")) for k in ("summary", "body")).strip()
            for note in json_lines(self.notifications)
        ]


def test_the_menu_follows_a_download_and_a_notification_ends_it(xsession, tmp_path: Path, hub: FakeHub) -> None:
    tray = DownloadTray(xsession, tmp_path, hub)
    try:
        tray.icon_window()
        url = tray.url()
        path = "Tiny-Q5_K_M.gguf"
        pause = hub.pause(f"{TINY}/{path}", 430_000)  # half of the file
        with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {tray.token}"}) as c:
            r = c.post("/models/pull", json={"model": f"hf.co/{TINY}:Q5_K_M", "include_mmproj": False})
            assert r.status_code == 202, r.text
            assert pause.reached.wait(60)
            tray.wait_item("Downloading")
            line = tray.wait_item(
                f"hf.co/{TINY}:Q5_K_M \u2014 ",
                check=lambda i: i["text"].split(" \u2014 ")[1].startswith("50%"),
                what="the download at 50% in the menu",
            )
            assert [i["text"] for i in line["submenu"]] == ["Cancel download"]
            tray.open_menu()
            xsession.screenshot("tray-menu-download.png")
            xsession.keys("Escape")
            wait_until(lambda: not tray.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)
            pause.release.set()
            wait_until(
                lambda: any("ready as tiny-hub:1m-q5_k_m" in n for n in tray.notified()),
                TIMEOUT,
                "the download-done notification",
                ignoring=Exception,
            )
            assert f"Downloaded hf.co/{TINY}:Q5_K_M: ready as tiny-hub:1m-q5_k_m." in tray.notified()[-1]
            wait_until(lambda: tray.item("Downloading") is None, TIMEOUT, "the download line to go", ignoring=Exception)
            tray.wait_item("Models", "tiny-hub:1m-q5_k_m")

            hub.flip[f"{TINY}/Tiny-Q4_K_M.gguf"] = 1000
            r = c.post("/models/pull", json={"model": f"{TINY}/Tiny-Q4_K_M.gguf"})
            assert r.status_code == 202, r.text
            wait_until(
                lambda: any("failed" in n for n in tray.notified()),
                TIMEOUT,
                "the download-failed notification",
                ignoring=Exception,
            )
            failed = tray.notified()[-1]
            assert f"Download of {TINY}/Tiny-Q4_K_M.gguf failed: Tiny-Q4_K_M.gguf arrived damaged" in failed
            # Cancel from the menu: the task ends cancelled, the part stays for a later pull.
            pause = hub.pause(f"{TINY}/Q8_0/Tiny-Q8_0-00001-of-00003.gguf", 200_000)
            r = c.post("/models/pull", json={"model": f"hf.co/{TINY}:Q8_0", "include_mmproj": False})
            assert r.status_code == 202, r.text
            task_id = r.json()["id"]
            assert pause.reached.wait(60)
            tray.wait_item(f"hf.co/{TINY}:Q8_0 \u2014 ", what="the Q8_0 download in the menu")
            tray.choose(f"hf.co/{TINY}:Q8_0 \u2014 ", "Cancel download")
            wait_until(
                lambda: c.get(f"/tasks/{task_id}").json()["status"] == "cancelled",
                TIMEOUT,
                "the download cancelled from the menu",
                ignoring=Exception,
            )
            pause.release.set()
            wait_until(lambda: tray.item("Downloading") is None, TIMEOUT, "the download line to go", ignoring=Exception)
            # The menu's worker notifies once the cancel is asked for, apart from the task's end and the menu's poll.
            wait_until(
                lambda: any(n.startswith("Download cancelled") for n in tray.notified()),
                TIMEOUT,
                "the notification that the download was cancelled",
                ignoring=Exception,
            )
        tray.choose("Quit", closes=False)
        assert tray.wait_exit() == 0
        assert "Traceback" not in tray.output.read_text()
    finally:
        tray.close()
        time.sleep(0.1)
        print(f"--- lmsp-tray output ---\n{tray.output.read_text()[-4000:]}")
