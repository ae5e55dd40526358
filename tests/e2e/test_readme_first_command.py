"""The README's first command, exactly as a newcomer pastes it, gives a tray icon whose menu opens.

A fresh copy of this checkout, a fresh home, a fresh `.venv` made by the command itself (its
installers/install.py chooses llama.cpp's backend for this machine; lmsp-tray's wheel cache, LMSP_WHEEL_CACHE,
may supply the llama-cpp-python wheel built earlier for that backend), on a desktop: Xvfb with the trayer tray and a
notification server on a private D-Bus. The command is read from README.md and run by bash as it
stands. Its `sudo apt-get install -y …` part is the only thing not done for real (a test does not
install system packages): a `sudo` first on PATH checks with dpkg that apt would have nothing left
to install — `.ci/run` installs the same packages. Then the tray icon must appear, a right-click on it must
open the menu (the menu window is found on the X server, and the screenshot shows a menu there, by
its pixels), and `lmsp-tray stop` must end it cleanly. Screenshots: test-artifacts/readme-*.png.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from desktop_support import PrivateBus, dbus_missing
from notify_server import NotifyServer
from support import free_port, wait_until
from xvfb import ROOT, XSession, missing_tools

pytestmark = [
    pytest.mark.xvfb,
    pytest.mark.skipif(bool(missing_tools() or dbus_missing()), reason=f"needs {missing_tools() or dbus_missing()}"),
    pytest.mark.skipif(shutil.which("dpkg") is None, reason="the README's first command is for Debian/Ubuntu"),
    pytest.mark.timeout(2400),
]

SUDO = """#!/bin/sh
# Stands in for sudo in tests/e2e/test_readme_first_command.py: apt-get must have nothing left to install.
[ "$1" = apt-get ] && [ "$2" = install ] || { echo "unexpected: sudo $*" >&2; exit 97; }
shift 2
for p in "$@"; do
    case "$p" in -*) continue ;; esac
    dpkg -s "$p" >/dev/null 2>&1 || { echo "apt would install $p (.ci/run installs it)" >&2; exit 98; }
done
echo "sudo apt-get install: all of $* already installed"
"""


def readme_first_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    run_it = text.index("**Run it**")
    block = re.search(r"```sh\n(.*?)\n```", text[run_it:], re.DOTALL)
    assert block is not None, "README.md has no ```sh block after **Run it**"
    command = block.group(1).strip()
    assert "\n" not in command, "the first command is one line a newcomer can paste"
    return command


def checkout_copy(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    for rel in listed.stdout.splitlines():
        source = ROOT / rel
        if source.is_file():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / rel)
    return target


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def menu_drawn(shot: Path, box: tuple[int, int, int, int]) -> tuple[float, float]:
    """(share of the box in one light background colour, share of dark text pixels) in the screenshot."""
    from collections import Counter

    from PIL import Image

    with Image.open(shot) as image:
        raw = image.convert("RGB").crop(box).tobytes()
    pixels = [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]
    background, count = Counter(pixels).most_common(1)[0]
    light = sum(background) > 3 * 200
    dark = sum(1 for p in pixels if sum(p) < 3 * 100)
    return (count / len(pixels) if light else 0.0), dark / len(pixels)


def test_the_readme_first_command_gives_a_tray_icon_whose_menu_opens(tmp_path):
    command = readme_first_command()
    assert command.startswith("sudo apt-get install -y ") and ".venv/bin/lmsp-tray" in command
    repo = checkout_copy(tmp_path / "lmsp-tray")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sudo").write_text(SUDO)
    (shim / "sudo").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    if port_taken(7373):  # the default port, used by something else on this machine: a setting, not the command
        (home / ".config" / "lmsp-tray").mkdir(parents=True)
        (home / ".config" / "lmsp-tray" / "config.toml").write_text(f"port = {free_port()}\n")
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout.strip()
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "LMSP_TRAY_HOME", "PYSTRAY_BACKEND", "GDK_BACKEND", "DISPLAY")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("XDG_")}
    path = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(sys.executable).parent != Path(p))
    env.update(
        PATH=f"{shim}{os.pathsep}{path}",  # not this test's venv: the command makes its own
        HOME=str(home),
        PIP_CACHE_DIR=cache or str(tmp_path / "pip-cache"),
        # The installer's wheel per backend: the one .ci/run passes, else beside pip's cache (~/.cache).
        LMSP_WHEEL_CACHE=os.environ.get("LMSP_WHEEL_CACHE")
        or str(Path(cache or tmp_path / "pip-cache").parent / "lmsp-tray" / "wheels"),
        PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring",
        NO_AT_BRIDGE="1",
    )
    with PrivateBus() as bus, XSession(width=1024, height=700) as x:
        notifications = NotifyServer(bus.address, tmp_path / "notifications.jsonl")
        env.update(DISPLAY=x.display_name, DBUS_SESSION_BUS_ADDRESS=bus.address)
        out_file = tmp_path / "readme.out"
        with out_file.open("w") as out:
            proc = subprocess.Popen(
                ["bash", "-c", command], cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:

            def icon() -> list[int]:
                assert proc.poll() is None, out_file.read_text()[-4000:]
                return x.tray_icons()

            started = time.monotonic()
            window = wait_until(icon, 1800, "the tray icon after the README's first command", ignoring=Exception)[0]
            print(f"icon {time.monotonic() - started:.0f} s after the command started (pip included)")
            wait_until(
                lambda: "from the system tray" in out_file.read_text(), 60, "the tray announced", ignoring=Exception
            )
            x.screenshot("readme-tray-icon.png")

            x.click(window, 3)  # the menu (a left-click opens the console page in the browser)
            menu = wait_until(x.popup_windows, 30, "the menu window after a click on the icon", ignoring=Exception)[0]
            assert menu.width > 200 and menu.height > 150, menu
            figures: list[tuple[float, float]] = []  # (background, text) of the last screenshot

            def drawn() -> bool:  # mapped is not yet painted: GTK draws the menu after its window maps
                figures[:] = [menu_drawn(x.screenshot("readme-menu-open.png"), menu.box())]
                background, text = figures[0]
                return background > 0.5 and text > 0.005  # a light menu with dark text on it

            wait_until(drawn, 30, lambda: f"the menu drawn, (background, text) {figures}", ignoring=Exception)
            x.keys("Escape")
            wait_until(lambda: not x.popup_windows(), 30, "the menu to close", ignoring=Exception)

            stop = subprocess.run(
                [str(repo / ".venv" / "bin" / "lmsp-tray"), "stop"],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert stop.returncode == 0, stop.stderr
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # our own session only
                proc.wait(10)
            notifications.stop()
    said = out_file.read_text()
    print(said[-3000:])
    assert "all of -y python3-venv" in said  # the apt part was checked, not skipped
    assert re.search(r"lmsp-tray install: llama\.cpp backend: (cpu|vulkan|cuda|metal) \(", said)  # says what and why
    assert re.search(r"from the system tray \((gtk|appindicator)\)", said)
    assert "Traceback" not in said and "no menu" not in said
    assert any(n["summary"] == "lmsp-tray is running" for n in notifications.records())  # the first-run welcome
