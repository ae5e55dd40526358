"""`lmsp-tray open`: open the console page of the running service in the default browser.

Why a module of its own: it is also what a second launch of `lmsp-tray` calls
(`open_console`) to bring the running instance forward. It asks the running
service for a console link (``POST /lmsp/v1/console/codes`` with the owner
token from the keyring, or ``LMSP_TRAY_TOKEN``: `cli.service`, as for the
token commands), then opens it through `lmsp_tray.console_link` so the
single-use code never appears on a command line. ``--print-url`` prints the link instead (it works
once, within a minute).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lmsp_tray.config import Paths
from lmsp_tray.console_link import BrowserUnavailable, open_in_browser


class NotRunning(RuntimeError):
    """There is no running instance to open."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "open",
        help="open the console page of the running service in your browser",
        description="Open the console (chat, models, apps and tokens, activity, settings) of the running "
        "lmsp-tray in the default browser. The link holds a code that works once, within a minute.",
    )
    parser.add_argument("--print-url", action="store_true", help="print the link instead of opening a browser")


def console_url(paths: Paths) -> str:
    """A fresh console link from the running service (raises `NotRunning`, or `CommandError`)."""
    from lmsp_tray.cli.service import ServiceAPI, find_service

    found = find_service(paths)
    if found is None:
        raise NotRunning("lmsp-tray is not running; start it with `lmsp-tray` (or `lmsp-tray serve`) first.")
    return str(ServiceAPI(*found).call("POST", "/console/codes")["url"])


def open_console(paths: Paths, *, print_only: bool = False) -> str:
    """Open the running instance's console in the browser (or only return the link); returns the link.

    Raises `NotRunning`, `cli.service.CommandError` (no token, service refused) or
    `console_link.BrowserUnavailable` (no display or browser: show the link instead)."""
    url = console_url(paths)
    if not print_only:
        open_in_browser(paths, url)
    return url


def run(paths: Paths, args: argparse.Namespace) -> int:
    from lmsp_tray.cli.service import CommandError

    try:
        url = open_console(paths, print_only=args.print_url)
    except (NotRunning, CommandError) as exc:
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return 1
    except BrowserUnavailable as exc:
        url = console_url(paths)
        print(f"lmsp-tray: {exc}; open this link instead (it works once, within a minute):", file=sys.stderr)
        print(url)
        return 0
    if args.print_url:
        print(url)
        print("The link works once, within a minute.", file=sys.stderr)
    else:
        print("Opened the lmsp-tray console in your browser.", file=sys.stderr)
    return 0
