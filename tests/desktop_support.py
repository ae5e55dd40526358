"""Real desktop parts for tests: a private D-Bus session bus, and small services that live on it.

- `PrivateBus`: `dbus-daemon --session` of our own, so notifications, the StatusNotifier watcher
  and the file manager service a test puts there are the only ones the program can reach.
- `DBusFake`: runs `tests/dbus_fakes.py` on that bus as a child process — a StatusNotifierWatcher
  (with or without a host) or an org.freedesktop.FileManager1 — recording the calls it gets.
- `lmsp_env`: the environment for a real `lmsp-tray` process in a temporary home.
- `tray_notices`: the tray's notification code (`Notices` over the real `Notifier`) sending to the
  test notification server on a bus of its own, for code that notifies through `TrayApp.notify`.

The notification server is `tests/notify_server.py` (`NotifyServer`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self

from support import ROOT, TESTS, json_lines, wait_until


def dbus_missing() -> str | None:
    if shutil.which("dbus-daemon") is None:
        return "dbus-daemon is not installed (Debian package dbus; .ci/run installs it)"
    try:
        import gi  # noqa: F401
        import jeepney  # noqa: F401
    except ImportError as exc:
        return f"needs {exc.name}"
    return None


class PrivateBus:
    """A session bus of our own; `address` goes into DBUS_SESSION_BUS_ADDRESS."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "DISPLAY")}
        self.proc = subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        if not self.address:
            self.stop()
            raise RuntimeError("dbus-daemon did not print its address")

    def has_owner(self, name: str) -> bool:
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection

        with open_dbus_connection(self.address) as conn:
            return bool(conn.send_and_get_reply(message_bus.NameHasOwner(name), timeout=5).body[0])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()  # the address pipe (a ResourceWarning if left to the collector)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DBusFake:
    """`tests/dbus_fakes.py KIND OUT` on `address`; `records()` are the calls it recorded."""

    def __init__(self, address: str, kind: str, out: Path, *args: str) -> None:
        self.out = out
        env = {"DBUS_SESSION_BUS_ADDRESS": address, "PATH": "/usr/bin:/bin", "NO_AT_BRIDGE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "dbus_fakes.py"), kind, str(out), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc

        def ready() -> bool:
            assert proc.poll() is None, f"the fake {kind} exited"
            return Path(f"{out}.ready").exists()

        wait_until(ready, 30, f"the fake {kind} to start", interval=0.05)

    def records(self) -> list[dict]:
        return json_lines(self.out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def lmsp_env(tmp_path: Path, *, bus: str | None = None, display: str | None = None, keyring: str = "fail") -> dict:
    """A temporary home for a real `lmsp-tray` (this checkout first on PYTHONPATH), no keyring by default."""
    home = tmp_path / "user"
    home.mkdir(exist_ok=True)
    drop = (
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "XDG_RUNTIME_DIR",
        "PYSTRAY_BACKEND",
        "DBUS_SESSION_BUS_ADDRESS",
        "GDK_BACKEND",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LMSP_TRAY")}
    env.update(
        LMSP_TRAY_HOME=str(tmp_path / "lmsp"),
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        HF_HOME=str(home / "hf"),
        OLLAMA_MODELS=str(home / "ollama"),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT),
        NO_AT_BRIDGE="1",
    )
    if keyring == "fail":
        env["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"
    if bus:
        env["DBUS_SESSION_BUS_ADDRESS"] = bus
    else:
        env["DBUS_SESSION_BUS_ADDRESS"] = "disabled:"
    if display:
        env["DISPLAY"] = display
        env["GDK_BACKEND"] = "x11"
    return env


def program() -> list[str]:
    """The installed `lmsp-tray` console script next to this Python, else `python -m lmsp_tray`."""
    script = Path(sys.executable).parent / "lmsp-tray"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lmsp_tray"]


def log_text(tmp_path: Path) -> str:
    """The lmsp-tray log file of the home `lmsp_env(tmp_path)` made."""
    try:
        return (tmp_path / "lmsp" / "cache" / "logs" / "lmsp-tray.log").read_text(encoding="utf-8")
    except OSError:
        return ""


@contextmanager
def tray_notices(out: Path) -> Iterator[tuple[Any, Any]]:
    """(app, server): `app.notify` sends as `TrayApp.notify` does (through `Notices` and the real
    `Notifier`) to a `NotifyServer` recording into `out`, both on a private bus."""
    from notify_server import NotifyServer

    from lmsp_tray.desktop.notify import Notices, Notifier

    with PrivateBus() as bus:
        server = NotifyServer(bus.address, out)
        notifier = Notifier(bus=bus.address)
        sender = Notices(notifier)
        try:
            yield SimpleNamespace(notify=lambda body, **how: sender.send(body, **how)), server
        finally:
            notifier.shutdown()
            server.stop()
