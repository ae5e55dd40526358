"""The system-tray icon: pystray on the main thread, driven by a `TrayBackend`.

The tray knows nothing about HTTP, engines or tokens; it talks to the
service through the small `TrayBackend` protocol below, which the daemon
implements. A poller thread takes a `snapshot()` every `poll_interval`
seconds (and at once after each click or `refresh()`), and when the state
changed it rebuilds the menu from `lmsp_tray.desktop.menu.build_menu` and switches
the icon. Clicks never run backend calls on the GUI thread (loading a model
takes seconds): each runs on a worker thread (what each one does is
`lmsp_tray.desktop.actions`, which sees the tray as an `ActionHost`), and a failure becomes a notification plus a
"⚠ ..." line in the menu and the error icon, never a traceback.

A left-click opens the console page (`open_console`) once the service
listens, the menu before that and on a right-click (an AppIndicator panel
always shows the menu); a second launch of lmsp-tray calls `show_yourself()`,
which opens the console the same way, else the menu where the toolkit allows,
else a notification. Notifications
go through `lmsp_tray.desktop.notify.Notifier` (own ids per kind, actions) when a
notification server listens, else through pystray.

The access token goes from `TrayBackend.access_token()` straight to the
clipboard (`lmsp_tray.desktop.system.Clipboard`: GTK's clipboard on the GTK
backends, else wl-copy/xclip/xsel/pbcopy/clip on stdin). It is never
logged, shown, or put in a notification.

With no display (`lmsp_tray.desktop.system.display_available()` is false, or
`load_pystray()` raises `TrayUnavailable`), the caller runs headless and
prints `headless_message(url)`.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from lmsp_tray.desktop.actions import QUIET, SERIOUS, ActionBackend, failure_prefix, is_user_error, run_action
from lmsp_tray.desktop.icons import draw_icon, load_icon
from lmsp_tray.desktop.menu import (
    ERROR,
    Action,
    MenuItemSpec,
    TrayState,
    activity_for,
    build_menu,
    full_reason,
    most_urgent,
    short_reason,
    status_text,
    tooltip,
)
from lmsp_tray.desktop.notify import Notices
from lmsp_tray.desktop.system import (
    Clipboard,
    display_available,
    headless_message,
    open_folder,
)
from lmsp_tray.desktop.toolkit import (
    GTK_BACKENDS,
    MenuHooks,
    TrayUnavailable,
    backend_name,
    default_icon_size,
    gtk_status_icon_size,
    icon_class,
    load_pystray,
    pystray_menu,
)

__all__ = [
    "TrayApp",
    "TrayBackend",
    "TrayUnavailable",
    # re-exported from lmsp_tray.desktop.system for the command line's convenience
    "display_available",
    "headless_message",
    "load_pystray",
]

log = logging.getLogger("lmsp_tray.desktop.tray")

APP_NAME = "lmsp-tray"
POLL_INTERVAL = 0.5  # seconds; the menu follows API changes within this (plus one snapshot)
FAILURE_SECONDS = 60.0  # how long a failed action keeps its line in the menu (and the error icon)
EMBED_WAIT_S = 5.0  # how long an X11 icon may take to appear in the tray before we say it is not shown


class TrayBackend(ActionBackend, Protocol):
    """What the tray needs from the running service (implemented by the daemon): what the clicks
    call (`ActionBackend`), the state the menu shows, and Quit.

    Every method may be called from any thread and may block (the tray calls
    them off the GUI thread). Failures are raised as exceptions whose text is
    fit for the user (e.g. `LMSPError`); the tray shows them, shortened.
    """

    def snapshot(self) -> TrayState: ...

    def quit(self) -> None:
        """The user chose Quit; called once after the tray loop has ended, on the main thread."""
        ...


Callback = Callable[[], None]


class TrayApp:
    """The tray icon and its menu over a `TrayBackend`. Build on the main thread, then `run()`."""

    def __init__(
        self,
        backend: TrayBackend,
        *,
        pystray: ModuleType | None = None,
        poll_interval: float = POLL_INTERVAL,
        clipboard: Clipboard | None = None,
        opener: Callable[[Path], Any] | None = None,
        icon_size: int | None = None,
        handle_signals: bool = True,
        notifier: Any = None,
        log_file: Path | None = None,
        host_seen: bool = True,
        on_shown: Callback | None = None,
        on_not_shown: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.pystray = pystray if pystray is not None else load_pystray()
        self.toolkit = backend_name(self.pystray)
        self.poll_interval = poll_interval
        self.clipboard = clipboard or Clipboard(use_gtk=self.toolkit in GTK_BACKENDS)
        self.opener = opener or open_folder
        self.icon_size = icon_size or default_icon_size(self.toolkit)
        self.handle_signals = handle_signals
        self.notifier = notifier  # lmsp_tray.desktop.notify.Notifier, or None: pystray's notifications
        self.log_file = log_file
        self.host_seen = host_seen
        self.on_shown = on_shown
        self.on_not_shown = on_not_shown
        self.shown = threading.Event()  # the icon is really visible (embedded, registered)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._failure: tuple[str, float, bool] | None = None  # (text, until, serious)
        self._images: dict[tuple[str, int], Any] = {}
        self._quit_requested = False
        self._poller: threading.Thread | None = None
        self._snapshot_failing = False
        self.notices = Notices(notifier, self._balloon)
        self._not_shown_reported = False
        self.state = self.overlay(self.safe_snapshot())
        self._service_notice: str | None = None  # the first poll announces a notice there at start
        self._shown_activity = self.state.activity
        self.hooks = MenuHooks(specs=self.menu_specs, click=self.click, primary=self.open_console)
        icon_type = icon_class(self.pystray, self.hooks)
        self.icon = icon_type(
            APP_NAME,
            icon=self._image(self.state.activity),
            title=tooltip(self.state),
            menu=self._pystray_menu(),
        )

    def _pystray_menu(self) -> Any:
        """The menu handed to pystray: none on GTK (synced Gtk widgets instead), a status click on xorg."""
        if self.toolkit in GTK_BACKENDS:
            return None
        if self.toolkit == "xorg":  # no menu there: a left-click shows the state in a notification
            return self.pystray.Menu(
                self.pystray.MenuItem("Status", lambda *_: self.click(Action.SHOW_STATUS), default=True)
            )
        return self.pystray.Menu(self._menu_items)

    # -- state ------------------------------------------------------------------------------------
    def safe_snapshot(self) -> TrayState:
        """The backend's snapshot; while it fails, the last state with the error as its notice."""
        try:
            state = self.backend.snapshot()
        except Exception as exc:
            if not self._snapshot_failing:  # log once per outage, not every poll
                log.warning("tray snapshot failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
            self._snapshot_failing = True
            previous = getattr(self, "state", TrayState())
            return dataclasses.replace(previous, notice=f"service not answering: {short_reason(exc)}", activity=ERROR)
        if self._snapshot_failing:
            log.info("tray snapshot works again")
            self._snapshot_failing = False
        return state

    def overlay(self, state: TrayState) -> TrayState:
        """The backend's state plus what the tray knows: the activity its models imply, and
        the last failed action (for FAILURE_SECONDS)."""
        with self._lock:
            failure = self._failure
            if failure is not None and time.monotonic() > failure[1]:
                self._failure = failure = None
        failed = failure is not None and failure[2]
        activity = most_urgent(state.activity, activity_for(state.models, failed=failed))
        notice = state.notice or (failure[0] if failure is not None else None)
        if activity == state.activity and notice == state.notice:
            return state
        return dataclasses.replace(state, notice=notice, activity=activity)

    def menu_specs(self) -> list[MenuItemSpec]:
        return build_menu(self.state)

    def _menu_items(self) -> tuple[Any, ...]:
        menu = pystray_menu(self.pystray, self.menu_specs(), self.click, escape_ampersand=self.toolkit == "win32")
        return tuple(menu.items)

    def _image(self, activity: str, size: int | None = None) -> Any:
        size = size or self.icon_size
        key = (activity, size)
        if key not in self._images:
            self._images[key] = (
                load_icon(activity, size) if size in (16, 22, 24, 32, 48, 64) else draw_icon(activity, size)
            )
        return self._images[key]

    def poll_once(self) -> bool:
        """Take a snapshot; update icon, tooltip and menu if it changed. True when it changed."""
        raw = self.safe_snapshot()
        if raw.notice != self._service_notice:
            self._service_notice = raw.notice
            if raw.notice and not self._snapshot_failing:
                self.notify(full_reason(raw.notice), title="lmsp-tray needs attention", kind="notice")
        new = self.overlay(raw)
        if new == self.state:
            return False
        self.state = new
        if new.activity != self._shown_activity:
            self._shown_activity = new.activity
            self.icon.icon = self._image(new.activity)
        self.icon.title = tooltip(new)
        self.icon.update_menu()
        return True

    def refresh(self) -> None:
        """Ask for a snapshot now (thread-safe; e.g. the daemon calls it when something changed)."""
        self._wake.set()

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                self.poll_once()
            except Exception:
                log.exception("tray refresh failed")

    # -- clicks -----------------------------------------------------------------------------------
    def click(self, action: Action, arg: str | None = None) -> None:
        """A menu click (GUI thread): Quit stops the loop; everything else runs on a worker thread."""
        if action is Action.QUIT:
            self._quit_requested = True
            self.stop()
            return
        worker = threading.Thread(target=self.perform, args=(action, arg), name=f"tray-{action.value}", daemon=True)
        worker.start()

    def perform(self, action: Action, arg: str | None = None) -> None:
        """Carry out one click synchronously; failures become a notification (whole text), and for
        most actions a notice line in the menu; failed model actions also turn the icon red."""
        try:
            done = run_action(self, action, arg)
        except Exception as exc:
            prefix = failure_prefix(action, arg)
            message = f"{prefix}: {full_reason(exc)}"
            log.warning("%s", message, exc_info=not is_user_error(exc))
            serious = action in SERIOUS
            if action not in QUIET:
                with self._lock:
                    self._failure = (message, time.monotonic() + FAILURE_SECONDS, serious)
            self.notify(full_reason(exc), title=prefix, kind=f"failure-{action.value}", critical=serious)
        else:
            with self._lock:
                self._failure = None
            if done:
                self.notify(done[1], title=done[0], kind=action.value)
        self.refresh()

    def notify(
        self,
        body: str,
        *,
        title: str = APP_NAME,
        kind: str | None = None,
        actions: Sequence[tuple[str, str]] = (),
        on_action: Callable[[str], None] | None = None,
        on_closed: Callback | None = None,
        critical: bool = False,
    ) -> int | None:
        """A desktop notification where the platform has one; never raises (see `notify.Notices`)."""
        return self.notices.send(
            body, title=title, kind=kind, actions=actions, on_action=on_action, on_closed=on_closed, critical=critical
        )

    def close_notification(self, nid: int | None) -> None:
        self.notices.close(nid)

    def _balloon(self, body: str, title: str) -> None:
        """pystray's own notification (Windows' balloon) where no D-Bus notifier answers."""
        if getattr(self.icon, "HAS_NOTIFICATION", False):
            self.icon.notify(body, title)

    def show_yourself(self) -> None:
        """Bring lmsp-tray forward (a second launch asked): open the console, else the menu, else
        say where it is."""
        if self.toolkit == "gtk":
            from gi.repository import GLib

            GLib.idle_add(self._show_on_main_loop)
            return
        if not self.open_console():
            self._show_by_notification()

    def open_console(self) -> bool:
        """Open the console page in the browser (a worker does it); False while the service does not
        listen yet, so the caller shows the menu instead."""
        if not self.state.url:
            return False
        self.click(Action.OPEN_CONSOLE)
        return True

    def _show_on_main_loop(self) -> bool:
        if self.open_console():
            return False
        popup = getattr(self.icon, "popup_menu", None)
        try:
            opened = bool(popup and popup())
        except Exception as exc:  # noqa: BLE001
            log.debug("could not open the menu: %s", exc)
            opened = False
        if not opened:
            self._show_by_notification()
        return False

    def _show_by_notification(self) -> None:
        where = "Click its icon in the panel for the menu." if self.shown.is_set() else "Its icon is not shown."
        self.notify(f"{status_text(self.state)}\n{where}", title="lmsp-tray is already running", kind="status")

    # -- running ----------------------------------------------------------------------------------
    @property
    def quit_requested(self) -> bool:
        """Whether the loop ended because the user chose Quit (not `stop()` or a signal)."""
        return self._quit_requested

    def run(self) -> int:
        """Show the icon and run the toolkit loop on this (main) thread until Quit or `stop()`.

        Returns 0 after Quit or `stop()`; calls `backend.quit()` after a Quit.
        """
        self._poller = threading.Thread(target=self._poll_loop, name="tray-poll", daemon=True)
        if self.handle_signals and self.toolkit not in GTK_BACKENDS:
            self._install_signal_handlers()
        try:
            self.icon.run(setup=self._setup)
        except Exception as exc:
            if not self._stopping.is_set():
                self._stopping.set()
                raise TrayUnavailable(f"the tray stopped unexpectedly ({short_reason(exc)})") from exc
            # pystray 0.19.5 on gtk raises GLib.Error from notification clean-up when no
            # notification daemon runs; the loop has ended normally.
            log.debug("ignored error while the tray loop ended: %s", exc)
        finally:
            self._stopping.set()
            self._wake.set()
        if self._quit_requested:
            try:
                self.backend.quit()
            except Exception as exc:  # noqa: BLE001
                log.warning("backend quit failed: %s", exc)
        return 0

    def _setup(self, icon: Any) -> None:
        icon.visible = True
        if self.handle_signals and self.toolkit in GTK_BACKENDS:
            self._install_signal_handlers()
        self._watch_panel_size()
        assert self._poller is not None
        self._poller.start()
        self._watch_visibility()

    # -- is it really shown? ------------------------------------------------------------------
    def _watch_visibility(self) -> None:
        """Report `on_shown` once the icon is visible; `on_not_shown(reason)` if it is not soon.

        Only GTK's XEmbed icon can say (`Gtk.StatusIcon.is_embedded()`); an AppIndicator icon was
        chosen because a watcher with a host runs, and pystray raises for the others.
        """
        status_icon = getattr(self.icon, "_status_icon", None)
        if self.toolkit != "gtk" or status_icon is None:
            self._mark_shown()
            return
        from gi.repository import GLib

        deadline = time.monotonic() + EMBED_WAIT_S

        def check() -> bool:
            if self._stopping.is_set():
                return False
            if status_icon.is_embedded():
                self._mark_shown()
                return False
            if time.monotonic() > deadline and not self._not_shown_reported:
                self._not_shown_reported = True
                self._report_not_shown()
            return True  # keep looking: a panel started after us still gets the icon

        GLib.timeout_add(100, check)

    def _mark_shown(self) -> None:
        if self.shown.is_set():
            return
        self.shown.set()
        if self._not_shown_reported:
            log.info("the tray icon is shown now")
        if self.on_shown is not None:
            try:
                self.on_shown()
            except Exception:
                log.warning("on_shown failed", exc_info=True)

    def _report_not_shown(self) -> None:
        from lmsp_tray.desktop.toolkit import NO_HOST

        reason = NO_HOST if not self.host_seen else "the system tray did not take the icon"
        if self.on_not_shown is not None:
            try:
                self.on_not_shown(reason)
            except Exception:
                log.warning("on_not_shown failed", exc_info=True)

    def stop(self) -> None:
        """End `run()` (thread-safe; e.g. on SIGTERM)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        try:
            self.icon.stop()
        except Exception as exc:  # noqa: BLE001 - see run()
            log.debug("ignored error while stopping the tray: %s", exc)

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT/SIGHUP end the loop cleanly.

        On GTK they are watched by the GLib loop (Python handlers would not run
        while it sits in C); this runs in pystray's setup thread, after pystray
        reset SIGINT. Elsewhere plain Python handlers are set from `run()` on
        the main thread.
        """
        if self.toolkit in GTK_BACKENDS:
            try:
                from gi.repository import GLib

                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    GLib.unix_signal_add(GLib.PRIORITY_HIGH, signum, self._on_signal, signum)
            except Exception as exc:  # noqa: BLE001
                log.debug("no GLib signal handlers: %s", exc)
            return
        if threading.current_thread() is threading.main_thread():
            for name in ("SIGTERM", "SIGINT"):
                try:
                    signal.signal(getattr(signal, name), lambda *_: self.stop())
                except (AttributeError, ValueError, OSError):
                    pass

    def _on_signal(self, signum: int) -> bool:
        log.info("received %s, closing the tray", signal.Signals(signum).name)
        self.stop()
        return False

    def _watch_panel_size(self) -> None:
        """On gtk, redraw the icon at the exact size the panel shows it (crisp, no scaling)."""
        status_icon = getattr(self.icon, "_status_icon", None)
        if status_icon is None or not hasattr(status_icon, "connect"):
            return

        def on_size_changed(_status_icon: Any, size: int) -> bool:
            wanted = gtk_status_icon_size(int(size))
            if wanted != self.icon_size:
                self.icon_size = wanted
                self.icon.icon = self._image(self.state.activity)
            return False

        try:
            status_icon.connect("size-changed", on_size_changed)
            from gi.repository import GLib

            # This runs on pystray's setup thread: the panel may have sized the icon already.
            GLib.idle_add(lambda: status_icon.is_embedded() and on_size_changed(status_icon, status_icon.get_size()))
        except Exception as exc:  # noqa: BLE001
            log.debug("no size-changed signal: %s", exc)
