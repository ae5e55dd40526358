"""The system-tray icon: pystray on the main thread, driven by a `TrayBackend`.

The tray knows nothing about HTTP, engines or tokens; it talks to the
service through the small `TrayBackend` protocol below, which the daemon
implements. A poller thread takes a `snapshot()` every `poll_interval`
seconds (and at once after each click or `refresh()`), and when the state
changed it rebuilds the menu from `lmsp_tray.desktop.menu.build_menu` and switches
the icon. Clicks never run backend calls on the GUI thread (loading a model
takes seconds): each runs on a worker thread, and a failure becomes a
notification plus a "⚠ ..." line in the menu and the error icon, never a
traceback.

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
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from lmsp_tray.desktop.icons import draw_icon, load_icon
from lmsp_tray.desktop.menu import (
    ERROR,
    ERROR_MARK,
    Action,
    MenuItemSpec,
    TrayState,
    activity_for,
    build_menu,
    clean_text,
    most_urgent,
    short_reason,
    tooltip,
)
from lmsp_tray.desktop.system import Clipboard, ClipboardError, display_available, headless_message, open_folder
from lmsp_tray.desktop.toolkit import (
    GTK_BACKENDS,
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
FAILURE_SECONDS = 60.0  # how long a failed action keeps its line in the menu and the error icon


class TrayBackend(Protocol):
    """What the tray needs from the running service (implemented by the daemon).

    Every method may be called from any thread and may block (the tray calls
    them off the GUI thread). Failures are raised as exceptions whose text is
    fit for the user (e.g. `LMSPError`); the tray shows them, shortened.
    """

    def snapshot(self) -> TrayState: ...

    def load_model(self, model_id: str) -> None: ...

    def unload_model(self, model_id: str) -> None: ...

    def unload_all(self) -> None: ...

    def rescan(self) -> None: ...

    def models_folder(self) -> Path: ...

    def open_console(self) -> None:
        """Open the console page in the browser (with a fresh single-use code)."""
        ...

    def access_token(self) -> str | None:
        """The secret of the token to hand to the user; it only ever goes to the clipboard."""
        ...

    def set_autostart(self, enabled: bool) -> None: ...

    def approve_pairing(self, pairing_id: str) -> None: ...

    def deny_pairing(self, pairing_id: str) -> None: ...

    def quit(self) -> None:
        """The user chose Quit; called once after the tray loop has ended, on the main thread."""
        ...


class TrayApp:
    """The tray icon and its menu over a `TrayBackend`. Build on the main thread, then `run()`."""

    def __init__(
        self,
        backend: TrayBackend,
        *,
        pystray: ModuleType | None = None,
        poll_interval: float = POLL_INTERVAL,
        clipboard: Clipboard | None = None,
        opener: Callable[[Path], None] | None = None,
        icon_size: int | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.backend = backend
        self.pystray = pystray if pystray is not None else load_pystray()
        self.toolkit = backend_name(self.pystray)
        self.poll_interval = poll_interval
        self.clipboard = clipboard or Clipboard(use_gtk=self.toolkit in GTK_BACKENDS)
        self.opener = opener or open_folder
        self.icon_size = icon_size or default_icon_size(self.toolkit)
        self.handle_signals = handle_signals
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._failure: tuple[str, float] | None = None
        self._images: dict[tuple[str, int], Any] = {}
        self._quit_requested = False
        self._poller: threading.Thread | None = None
        self._snapshot_failing = False
        self.state = self._overlay(self._safe_snapshot())
        self._shown_activity = self.state.activity
        self.icon = icon_class(self.pystray)(
            APP_NAME,
            icon=self._image(self.state.activity),
            title=tooltip(self.state),
            menu=self.pystray.Menu(self._menu_items),
        )

    # -- state ------------------------------------------------------------------------------------
    def _safe_snapshot(self) -> TrayState:
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

    def _overlay(self, state: TrayState) -> TrayState:
        """The backend's state plus what the tray knows: the activity its models imply, and
        the last failed action (for FAILURE_SECONDS)."""
        with self._lock:
            failure = self._failure
            if failure is not None and time.monotonic() > failure[1]:
                self._failure = failure = None
        activity = most_urgent(state.activity, activity_for(state.models, failed=failure is not None))
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
        new = self._overlay(self._safe_snapshot())
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
        """Carry out one click synchronously; failures become a notice, a notification and the error icon."""
        try:
            done = self._do(action, arg)
        except Exception as exc:
            message = f"{self._failure_prefix(action, arg)}: {short_reason(exc, 80)}"
            log.warning("%s", message, exc_info=not _is_user_error(exc))
            with self._lock:
                self._failure = (message, time.monotonic() + FAILURE_SECONDS)
            self.notify(f"{ERROR_MARK} {message}")
        else:
            with self._lock:
                self._failure = None
            if done:
                self.notify(done)
        self.refresh()

    def _do(self, action: Action, arg: str | None) -> str | None:
        b = self.backend
        if action is Action.COPY_URL:
            if not self.state.url:
                raise RuntimeError("the service is not listening yet")
            self.clipboard.copy(self.state.url)
            return f"Copied {self.state.url}"
        if action is Action.OPEN_CONSOLE:
            b.open_console()
            return None
        if action is Action.LOAD_MODEL:
            b.load_model(_need(arg))
            return f"Loaded {clean_text(_need(arg), 60)}"
        if action is Action.UNLOAD_MODEL:
            b.unload_model(_need(arg))
            return None
        if action is Action.UNLOAD_ALL:
            b.unload_all()
            return None
        if action is Action.RESCAN:
            b.rescan()
            count = len(self._safe_snapshot().models)
            return f"Found {count} model{'s' if count != 1 else ''}"
        if action is Action.OPEN_MODELS_FOLDER:
            folder = b.models_folder()
            folder.mkdir(parents=True, exist_ok=True)
            self.opener(folder)
            return None
        if action is Action.COPY_TOKEN:
            secret = b.access_token()
            if not secret:
                raise RuntimeError("there is no access token yet")
            try:
                self.clipboard.copy(secret)
            finally:
                del secret
            return "Access token copied to the clipboard"
        if action is Action.SET_AUTOSTART:
            b.set_autostart(arg == "on")
            return "lmsp-tray will start at login" if arg == "on" else "lmsp-tray will not start at login"
        if action is Action.APPROVE_PAIRING:
            b.approve_pairing(_need(arg))
            return "Pairing approved"
        if action is Action.DENY_PAIRING:
            b.deny_pairing(_need(arg))
            return "Pairing denied"
        raise ValueError(f"unknown action {action!r}")

    @staticmethod
    def _failure_prefix(action: Action, arg: str | None) -> str:
        name = clean_text(arg or "", 40)
        return {
            Action.COPY_URL: "Could not copy the URL",
            Action.OPEN_CONSOLE: "Could not open the console",
            Action.LOAD_MODEL: f"Could not load {name}",
            Action.UNLOAD_MODEL: f"Could not unload {name}",
            Action.UNLOAD_ALL: "Could not unload the models",
            Action.RESCAN: "Rescan failed",
            Action.OPEN_MODELS_FOLDER: "Could not open the models folder",
            Action.COPY_TOKEN: "Could not copy the access token",
            Action.SET_AUTOSTART: "Could not change start at login",
            Action.APPROVE_PAIRING: "Could not approve the pairing",
            Action.DENY_PAIRING: "Could not deny the pairing",
        }.get(action, "Failed")

    def notify(self, message: str) -> None:
        """A desktop notification where the platform has one; never raises."""
        try:
            if getattr(self.icon, "HAS_NOTIFICATION", False):
                self.icon.notify(message, APP_NAME)
        except Exception as exc:  # noqa: BLE001 - no notification daemon is not an error
            log.debug("notification not shown: %s", exc)

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
        except Exception as exc:  # noqa: BLE001
            log.debug("no size-changed signal: %s", exc)


def _need(arg: str | None) -> str:
    if not arg:
        raise ValueError("this menu item names no model or request")
    return arg


def _is_user_error(exc: BaseException) -> bool:
    """Errors with a message meant for people (no traceback in the log needed)."""
    from lmsp_tray.errors import LMSPError

    return isinstance(exc, (LMSPError, ClipboardError, OSError, RuntimeError, ValueError))
