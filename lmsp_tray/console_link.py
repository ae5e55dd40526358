"""Opening the console in the user's browser without putting its code on a command line.

Why: a console URL carries a single-use code (`lmsp_tray.auth.console`), and
a browser started with a URL shows it in its command line, which every user
of the machine can read (``ps``). So, as Jupyter does, the URL goes into a
small redirect page in the runtime folder (mode 0600 in a 0700 folder) and
the browser is given that file's path; the page forwards at once. Browsers
confined by snap or flatpak cannot read that folder: for them the URL is
passed directly — the code still works once and only for a minute.

Used by the tray ("Open lmsp-tray"), `lmsp-tray open` and a second launch.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
import sys
import webbrowser
from collections.abc import Callable, Mapping
from pathlib import Path

from lmsp_tray.config import Paths
from lmsp_tray.display import display_available
from lmsp_tray.private import write_private

REDIRECT_FILE = "console-open.html"
SANDBOXED_APP_DIRS = ("/var/lib/snapd/desktop/applications", "/var/lib/flatpak/exports", "/.local/share/flatpak")


class BrowserUnavailable(RuntimeError):
    """No browser could be started (no display, or nothing registered)."""


def redirect_page(url: str) -> str:
    """A page that forwards to `url` at once (a link too, for browsers that do not follow)."""
    quoted = html.escape(url, quote=True)
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='0;url={quoted}'>"
        "<meta name='referrer' content='no-referrer'><title>Opening lmsp-tray…</title></head>\n"
        f"<body><p>Opening lmsp-tray… <a href='{quoted}'>Continue</a></p></body></html>\n"
    )


def write_redirect(paths: Paths, url: str) -> Path:
    """Write the redirect page (0600, in the 0700 runtime folder), replacing the previous one."""
    folder = paths.runtime_dir
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = folder / REDIRECT_FILE
    write_private(target, redirect_page(url))
    return target


def default_browser_sandboxed(
    environ: Mapping[str, str] | None = None,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
    platform: str = sys.platform,
) -> bool:
    """Whether the default browser is a snap or flatpak (Linux), which cannot read the runtime folder."""
    if not platform.startswith("linux"):
        return False
    tool = which("xdg-settings")
    if not tool:
        return False
    try:
        out = run([tool, "get", "default-web-browser"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    desktop_id = out.stdout.strip()
    if not desktop_id.endswith(".desktop"):
        return False
    env = os.environ if environ is None else environ
    data_dirs = [env.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")]
    data_dirs += (env.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share").split(":")
    for folder in data_dirs:
        found = Path(folder) / "applications" / desktop_id
        if found.exists():
            where = str(found.resolve())
            return any(marker in where for marker in SANDBOXED_APP_DIRS)
    return "_" in desktop_id.removesuffix(".desktop")  # snap ids: <snap>_<app>.desktop


def browser_possible(environ: Mapping[str, str] | None = None) -> bool:
    """A graphical session, or a `BROWSER` set (which may be a text-mode browser in this terminal)."""
    env = os.environ if environ is None else environ
    return display_available(env) or bool(env.get("BROWSER"))


def open_in_browser(paths: Paths, url: str, *, opener: Callable[[str], bool] = webbrowser.open) -> str:
    """Open `url` in the default browser; returns what was opened (the redirect file's URI, or the URL).

    Raises `BrowserUnavailable` when there is no display or no browser; the caller then shows the URL."""
    if not browser_possible():
        raise BrowserUnavailable("there is no display to open a browser on")
    target = url if default_browser_sandboxed() else write_redirect(paths, url).as_uri()
    if not opener(target):
        raise BrowserUnavailable("no web browser could be started")
    return target
