"""Desktop integration that needs no GUI toolkit: is there a display, the clipboard, the file manager.

Kept apart from `lmsp_tray.desktop.tray` so the command line can decide "tray or
headless" without importing pystray, and so these helpers are testable on
any machine. Whether there is a display is `lmsp_tray.display`'s one check,
re-exported here with the headless message that goes with it.

Clipboard: GTK's own clipboard when the tray runs on a GTK backend (set on
the GTK main loop), else the first available of `wl-copy` (Wayland),
`xclip`, `xsel` (X11), `pbcopy` (macOS), `clip` (Windows). Text is fed on
stdin, never on a command line (other users can read those).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lmsp_tray.display import display_available  # noqa: F401 - the one check, re-exported for the tray

log = logging.getLogger("lmsp_tray.desktop.system")


class ClipboardError(RuntimeError):
    """Nothing could put text on the clipboard."""


# -- display -----------------------------------------------------------------------------------------


def headless_message(url: str | None = None, reason: str | None = None) -> str:
    """The one line printed when the tray cannot be shown."""
    why = reason or "no display (DISPLAY and WAYLAND_DISPLAY are not set)"
    where = f"; serving {url}" if url else ""
    return (
        f"lmsp-tray: {why} \u2014 running headless without a tray icon{where}. Stop it with Ctrl+C or `lmsp-tray stop`."
    )


# -- clipboard and file manager --------------------------------------------------------------------


class Clipboard:
    """Puts text on the clipboard; GTK's when the tray runs on GTK, else a command-line tool."""

    def __init__(
        self,
        *,
        use_gtk: bool = False,
        environ: Mapping[str, str] | None = None,
        platform: str | None = None,
        which: Callable[[str], str | None] = shutil.which,
        run: Callable[..., Any] = subprocess.run,
    ) -> None:
        self.use_gtk = use_gtk
        self.environ = os.environ if environ is None else environ
        self.platform = platform or sys.platform
        self._which = which
        self._run = run

    def commands(self) -> list[list[str]]:
        """The fallback tools, in the order tried."""
        if self.platform == "darwin":
            return [["pbcopy"]]
        if self.platform in ("win32", "cygwin"):
            return [["clip"]]
        tools = []
        if self.environ.get("WAYLAND_DISPLAY"):
            tools.append(["wl-copy"])
        tools += [["xclip", "-selection", "clipboard", "-in"], ["xsel", "--clipboard", "--input"]]
        return tools

    def copy(self, text: str) -> str:
        """Copy `text`; returns which method did it. Raises `ClipboardError`."""
        if self.use_gtk:
            try:
                self._copy_gtk(text)
                return "gtk"
            except Exception as exc:  # noqa: BLE001 - fall back to the tools
                log.warning("GTK clipboard failed (%s); trying clipboard tools", type(exc).__name__)
        for argv in self.commands():
            path = self._which(argv[0])
            if not path:
                continue
            try:
                # stdout/stderr to DEVNULL: xclip stays behind to serve the selection and would hold a pipe open.
                self._run(
                    [path, *argv[1:]],
                    input=text.encode("utf-8"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=5,
                    check=True,
                )
                return argv[0]
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("%s failed: %s", argv[0], type(exc).__name__)
        tools = ", ".join(a[0] for a in self.commands())
        raise ClipboardError(f"no clipboard tool worked (install one of: {tools})")

    @staticmethod
    def _copy_gtk(text: str, timeout: float = 5.0) -> None:
        import gi

        gi.require_version("Gtk", "3.0")
        gi.require_version("Gdk", "3.0")
        from gi.repository import Gdk, GLib, Gtk

        done = threading.Event()
        failures: list[BaseException] = []

        def on_main_loop() -> bool:
            try:
                board = Gtk.Clipboard.get(Gdk.SELECTION_CLIPBOARD)
                board.set_text(text, -1)
                board.store()  # hand it to a clipboard manager, if one runs, so it outlives us
            except Exception as exc:  # noqa: BLE001
                failures.append(exc)
            finally:
                done.set()
            return False

        if threading.current_thread() is threading.main_thread():
            on_main_loop()
        else:
            GLib.idle_add(on_main_loop)
            if not done.wait(timeout):
                raise ClipboardError("the GTK main loop did not answer")
        if failures:
            raise ClipboardError(str(failures[0]))


class OpenError(RuntimeError):
    """Nothing could show a folder or file; the message names it, so the person can go there."""


def open_folder(path: Path, platform: str | None = None, **kw: Any) -> str:
    """Show the folder `path` in the file manager; returns how (raises `OpenError`)."""
    return open_path(path, platform, folder=True, **kw)


def open_path(
    path: Path,
    platform: str | None = None,
    *,
    folder: bool | None = None,
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> str:
    """Open `path` the way the desktop does (a folder in the file manager, a file in its app).

    Linux and the BSDs: `gio open`, then `xdg-open`, then the file manager's own D-Bus service
    (org.freedesktop.FileManager1: GNOME Files, Dolphin, Nemo, Thunar, Caja …), so a desktop
    without xdg-utils still works. macOS: `open`; Windows: the shell. Returns what did it.
    """
    platform = platform or sys.platform
    env = os.environ if environ is None else environ
    folder = path.is_dir() if folder is None else folder
    if platform == "win32":
        os.startfile(str(path))  # type: ignore[attr-defined]
        return "shell"
    if platform == "darwin":
        return _spawn_first([["open", str(path)]], which) or _cannot_open(path, "open")
    tried = []
    for argv in (["gio", "open", str(path)], ["xdg-open", str(path)]):
        tried.append(argv[0])
        found = which(argv[0])
        if found and _run_quietly([found, *argv[1:]]):
            return argv[0]
    tried.append("the FileManager1 D-Bus service")
    if _file_manager_dbus(path, folder, env):
        return "org.freedesktop.FileManager1"
    return _cannot_open(path, ", ".join(tried))


def _cannot_open(path: Path, tried: str) -> str:
    raise OpenError(f"no file manager answered (tried {tried}); the {_kind(path)} is {path}")


def _kind(path: Path) -> str:
    return "file" if path.is_file() else "folder"


def _spawn_first(commands: list[list[str]], which: Callable[[str], str | None]) -> str | None:
    for argv in commands:
        found = which(argv[0])
        if found and _run_quietly([found, *argv[1:]]):
            return argv[0]
    return None


def _run_quietly(argv: list[str], timeout: float = 10.0) -> bool:
    """Run an opener and wait for its verdict (they hand off to the desktop and exit at once)."""
    try:
        done = subprocess.run(
            argv,
            check=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return True  # still running: an opener that stays (some xdg-open setups) has done its part
    except OSError as exc:
        log.debug("%s failed: %s", argv[0], exc)
        return False
    if done.returncode != 0:
        log.debug("%s failed (%d): %s", argv[0], done.returncode, done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


def _file_manager_dbus(path: Path, folder: bool, env: Mapping[str, str]) -> bool:
    """org.freedesktop.FileManager1.ShowFolders (a folder) or ShowItems (a file, selected)."""
    if not env.get("DBUS_SESSION_BUS_ADDRESS"):
        return False
    try:
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.io.blocking import open_dbus_connection

        address = DBusAddress(
            "/org/freedesktop/FileManager1",
            bus_name="org.freedesktop.FileManager1",
            interface="org.freedesktop.FileManager1",
        )
        method = "ShowFolders" if folder else "ShowItems"
        with open_dbus_connection(env["DBUS_SESSION_BUS_ADDRESS"]) as conn:
            call = new_method_call(address, method, "ass", ([path.resolve().as_uri()], ""))
            reply = conn.send_and_get_reply(call, timeout=10)
        return reply.header.message_type != MessageType.error
    except Exception as exc:  # noqa: BLE001 - no bus, no file manager service
        log.debug("FileManager1 failed: %s", exc)
        return False
