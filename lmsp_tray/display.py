"""Whether a graphical session is there: the one check behind "tray or headless" and "open a browser".

Why a module of its own, at the bottom: the command line decides whether to show a tray icon
(`lmsp_tray.desktop`) and whether a browser can open the console (`lmsp_tray.console_link`,
which sits below the desktop), and both must give the same answer for the same session.
macOS and Windows always have one; elsewhere an X11 (`DISPLAY`) or Wayland (`WAYLAND_DISPLAY`)
session says so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def display_available(environ: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """Whether a GUI session is there: always on macOS and Windows; DISPLAY/WAYLAND_DISPLAY elsewhere."""
    env = os.environ if environ is None else environ
    platform = platform or sys.platform
    if platform in ("darwin", "win32", "cygwin"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))
