"""Desktop integration that needs no GUI toolkit: is there a display, the clipboard, the file manager.

Kept apart from `lmsp_tray.desktop.tray` so the command line can decide "tray or
headless" without importing pystray, and so these helpers are testable on
any machine.

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

log = logging.getLogger("lmsp_tray.desktop.system")


class ClipboardError(RuntimeError):
    """Nothing could put text on the clipboard."""


# -- display -----------------------------------------------------------------------------------------


def display_available(environ: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """Whether a GUI session is there: always on macOS and Windows; DISPLAY/WAYLAND_DISPLAY elsewhere."""
    env = os.environ if environ is None else environ
    platform = platform or sys.platform
    if platform in ("darwin", "win32", "cygwin"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


def headless_message(url: str | None = None, reason: str | None = None) -> str:
    """The one line printed when the tray cannot be shown."""
    why = reason or "no display (DISPLAY and WAYLAND_DISPLAY are not set)"
    where = f"; serving {url}" if url else ""
    return f"lmsp-tray: {why} \u2014 running headless without a tray icon{where}. Stop it with Ctrl+C."


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


def open_folder(path: Path, platform: str | None = None) -> None:
    """Show `path` in the file manager (xdg-open, open, or Explorer)."""
    platform = platform or sys.platform
    if platform == "win32":
        os.startfile(str(path))  # type: ignore[attr-defined]
        return
    tool = "open" if platform == "darwin" else "xdg-open"
    found = shutil.which(tool)
    if not found:
        raise FileNotFoundError(f"{tool} not found; the folder is {path}")
    subprocess.Popen(
        [found, str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
