"""The desktop put together: `run_tray` builds the tray's parts over a live daemon and runs them.

Why a module: each part knows only its own idea — `backend` shows the daemon to the tray
(`DaemonTrayBackend`, `tray_hooks`), `tray` runs the icon and its menu, `actions` says what a
click does, `service_notices` what the person is told when something happens in the service,
`toolkit` which tray backend this desktop has, `notify` how notifications reach it. This is the
one place that knows them all and wires them together.

`run_tray(daemon, sock, …)` is what the bare `lmsp-tray` command runs when a display is there:
it chooses the tray backend (`toolkit.choose_backend`), runs the tray on the main thread and the
HTTP server on a background thread, and redraws the menu as soon as the model manager or the
folder watcher reports a change (the tray's 0.5 s poll catches the rest). It says "from the
system tray" only once the icon is really shown; when no tray can show it, it says so in one
line and a notification and serves headless. A second launch opens the console (else the menu).
The toolkit modules are imported only once a tray is to be shown: serving headless loads neither
pystray nor PIL.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from lmsp_tray import __version__
from lmsp_tray.desktop.autostart import Autostart
from lmsp_tray.desktop.backend import DaemonTrayBackend, TrayHooks, tray_hooks
from lmsp_tray.desktop.menu import short_reason
from lmsp_tray.desktop.notify import Notifier
from lmsp_tray.desktop.service_notices import (
    watch_crashes,
    watch_downloads,
    watch_gpu,
    watch_keyring,
    watch_pairings,
    welcome,
)
from lmsp_tray.desktop.system import headless_message
from lmsp_tray.desktop.toolkit import choose_backend
from lmsp_tray.desktop.tray import TrayApp, TrayUnavailable, load_pystray

if TYPE_CHECKING:
    import socket

    from lmsp_tray.daemon import Daemon
    from lmsp_tray.instance import ShowRequests

log = logging.getLogger("lmsp_tray.desktop.tray")


class Reporter(Protocol):
    """How the tray tells the person something before or without an icon (the CLI's `Reporter`):
    a line on stderr, the log file and a desktop notification."""

    def notice(self, message: str, *, summary: str, stream: str = "stderr", notify: bool = True) -> None: ...

    def notify(self, summary: str, body: str, *, critical: bool = False) -> bool: ...


def _headless(daemon: Daemon, sock: socket.socket, reporter: Reporter, show: ShowRequests, reason: str) -> int:
    """No tray can be shown: say so (one line, a notification), then serve in the foreground."""
    reporter.notice(headless_message(daemon.url, reason), summary="lmsp-tray runs without a tray icon")
    url = daemon.url

    def shown_headless() -> None:
        reporter.notify(
            "lmsp-tray is already running",
            f"It serves {url} without a tray icon: {reason}. Stop it with `lmsp-tray stop`.",
        )

    show.set_handler(shown_headless)
    daemon.serve_forever(sock)
    return 0


def run_tray(
    daemon: Daemon,
    sock: socket.socket,
    *,
    show: ShowRequests,
    reporter: Reporter,
    first_run: bool = False,
    model_count: int = 0,
    autostart: Autostart | None = None,
    hooks: TrayHooks | None = None,
) -> int:
    """The tray on this (main) thread, the API on a background thread; returns the exit code."""
    backend = DaemonTrayBackend(
        daemon, autostart or Autostart.for_platform(), hooks if hooks is not None else tray_hooks(daemon)
    )
    choice = choose_backend()
    if choice.name is None:
        return _headless(daemon, sock, reporter, show, choice.reason or "no system tray")
    url = daemon.url
    announced = threading.Event()

    def shown() -> None:
        if announced.is_set():
            log.info("the tray icon is shown now (%s)", app.toolkit)
            return
        announced.set()
        how = (
            "Click the icon for its state; quit with Ctrl+C or `lmsp-tray stop`."  # xorg's icon has no menu
            if app.toolkit == "xorg"
            else "Click the icon for its menu; quit from it, with Ctrl+C or `lmsp-tray stop`."
        )
        reporter.notice(
            f"lmsp-tray {__version__} serving {url} with {model_count} model(s) from the system tray "
            f"({app.toolkit}). {how}",
            summary="lmsp-tray",
            notify=False,
        )
        if choice.note:
            reporter.notice(f"lmsp-tray: {choice.note}", summary="lmsp-tray's tray icon is limited")
        if first_run:
            welcome(app, daemon)

    def not_shown(reason: str) -> None:
        reporter.notice(headless_message(url, reason), summary="lmsp-tray runs without a tray icon")

    try:
        pystray = load_pystray(backend=choice.name or None)
        notifier = Notifier() if sys.platform.startswith("linux") else None
        app = TrayApp(
            backend,
            pystray=pystray,
            notifier=notifier,
            log_file=daemon.paths.log_dir / "lmsp-tray.log",
            host_seen=choice.host_seen,
            on_shown=shown,
            on_not_shown=not_shown,
        )
    except Exception as exc:  # noqa: BLE001 - TrayUnavailable, or a toolkit refusing to start
        reason = (
            str(exc)
            if isinstance(exc, TrayUnavailable)
            else f"the system tray is not available ({short_reason(exc, 160)})"
        )
        return _headless(daemon, sock, reporter, show, reason)

    daemon.start_background(sock)
    if daemon.ollama_refused:  # the opt-in second listener found its port taken: say so, not only in the log
        reporter.notice(daemon.ollama_refused, summary="lmsp-tray: Ollama's port is taken")
    refresh: Callable[..., None] = lambda *_: app.refresh()
    daemon.models.subscribe(refresh)
    daemon.watcher.subscribe(refresh)
    show.set_handler(app.show_yourself)
    watch_pairings(app, backend.hooks.subscribe_pairings)
    watch_keyring(app, daemon)
    watch_downloads(app, daemon)
    watch_crashes(app, daemon)
    watch_gpu(app, daemon)
    try:
        try:
            return app.run()
        except Exception as exc:  # noqa: BLE001 - TrayUnavailable: the toolkit died under us
            reporter.notice(headless_message(url, str(exc)), summary="lmsp-tray runs without a tray icon")
            show.set_handler(None)
            _wait_for_signal(daemon)
            return 0
    finally:
        daemon.stop_background()  # a no-op after Quit; after SIGTERM/SIGINT the same clean stop
        if app.notifier is not None:
            app.notifier.shutdown()


def _wait_for_signal(daemon: Daemon) -> None:
    """Keep serving (the tray died) until SIGTERM/SIGINT or the server stops."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5) and daemon.serving:
        pass
