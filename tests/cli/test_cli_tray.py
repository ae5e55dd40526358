"""Bare `lmsp-tray` (the tray command) where no tray can be shown: one clear line, then headless serving.

The tray itself is tested under Xvfb (test_tray_daemon_xvfb.py); these run
the real command as a process on any machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import TINY_ID, cli_token, isolated_env, wait_until


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return isolated_env(tmp_path, drop=("PYSTRAY_BACKEND", "DBUS_SESSION_BUS_ADDRESS"))


def unused_display() -> str:
    number = 4000
    while Path(f"/tmp/.X11-unix/X{number}").exists():
        number += 1
    return f":{number}"


def run_bare(env: dict[str, str], models_dir: Path, tmp_path: Path) -> tuple[str, str]:
    """Start bare `lmsp-tray`, wait until it serves, check it, SIGTERM it; (url, everything it printed)."""
    log = tmp_path / "out.txt"
    auth = {"Authorization": f"Bearer {cli_token([sys.executable, '-m', 'lmsp_tray'], env, 'models:read')}"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmsp_tray", "--port", "0", "--models-dir", str(models_dir), "--no-default-dirs"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    discovery = tmp_path / "lmsp" / "run" / "service.json"
    try:

        def written() -> bool:
            assert proc.poll() is None, log.read_text()
            return discovery.exists()

        wait_until(written, 60, lambda: f"the discovery file; the log says: {log.read_text()}")
        url = json.loads(discovery.read_text())["url"]
        assert httpx.get(url, timeout=10).json()["object"] == "service"
        assert TINY_ID in [m["id"] for m in httpx.get(f"{url}/models", timeout=10, headers=auth).json()["data"]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not discovery.exists()
    return url, log.read_text()


def test_no_display_one_line_then_headless(env, models_dir, tmp_path):
    url, text = run_bare(env, models_dir, tmp_path)
    lines = [line for line in text.splitlines() if "headless" in line]
    assert lines == [
        (
            f"lmsp-tray: no display (DISPLAY and WAYLAND_DISPLAY are not set) \u2014 running headless "
            f"without a tray icon; serving {url}. Stop it with Ctrl+C or `lmsp-tray stop`."
        )
    ]
    assert "from the system tray" not in text and "Traceback" not in text


def test_display_that_does_not_answer_one_line_then_headless(env, models_dir, tmp_path):
    env["DISPLAY"] = unused_display()
    url, text = run_bare(env, models_dir, tmp_path)
    lines = [line for line in text.splitlines() if "headless" in line]
    assert len(lines) == 1 and lines[0].startswith(f"lmsp-tray: the X display {env['DISPLAY']} does not answer")
    assert url in lines[0]
    assert "from the system tray" not in text and "Traceback" not in text
