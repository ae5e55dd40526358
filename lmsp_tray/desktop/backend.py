"""The daemon as the tray sees it: `DaemonTrayBackend`, and `run_tray` that puts the two together.

`lmsp_tray.desktop.tray` knows nothing of the service; it talks to a `TrayBackend`.
This module implements that protocol over the live `Daemon`, in process (no
HTTP): the menu's model list is the catalog plus the `ModelManager`'s states,
a click on a model calls `ModelManager.acquire` / `unload` directly (the
tray runs clicks on worker threads, so a load may block for seconds), Rescan
is the folder watcher's rescan, and Quit stops the daemon the same way
SIGTERM does (open streams end with a terminal event, models unload, the
discovery file goes).

`run_tray(daemon, sock)` is what the bare `lmsp-tray` command runs when a
display is there: the tray on the main thread, the HTTP server on a
background thread, and the menu redrawn as soon as the model manager or the
folder watcher reports a change (the tray's 0.5 s poll catches the rest,
e.g. a model starting to generate).

`TrayHooks` is the one place the daemon hands the tray its owner token,
pairing requests and keyring trouble: see `tray_hooks()` below. A new
pairing request also raises a desktop notification (app name, scopes, code),
and so does a model whose process crashed (what happened, and that the next
request loads it again); the menu shows the reason beside the model.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmsp_tray.desktop.menu import MODEL_ERROR, ModelView, PairingView, TrayState, clean_text, short_reason
from lmsp_tray.errors import LMSPError, ModelNotFound

if TYPE_CHECKING:
    import socket

    from lmsp_tray.daemon import Daemon
    from lmsp_tray.desktop.autostart import Autostart

log = logging.getLogger("lmsp_tray.desktop.tray")


# -- hooks the security work fills in ---------------------------------------------------------------


class PairingLike(Protocol):
    """What the tray reads of a pending pairing request (security's `PairingView` has these)."""

    @property
    def id(self) -> str: ...
    @property
    def app_name(self) -> str: ...
    @property
    def scopes(self) -> Sequence[str]: ...
    @property
    def user_code(self) -> str: ...


def _no_token() -> str | None:
    return None


def _no_pairings() -> Sequence[PairingLike]:
    return ()


def _no_pairing_action(_pairing_id: str) -> Any:
    raise LMSPError("Pairing requests are not supported by this build.")


def _no_subscription(_listener: Callable[..., None]) -> None:
    return None


def _no_notice() -> str | None:
    return None


@dataclass(frozen=True)
class TrayHooks:
    """How the tray reaches the owner token and pairing requests (defaults: none of either).

    - `access_token()`: the owner token's secret (only ever put on the clipboard), or None.
    - `pending_pairings()`: the requests waiting for the user (objects with id, app_name,
      scopes, user_code).
    - `approve_pairing(id)` / `deny_pairing(id)`: the user's answer; raise with a human message.
    - `subscribe_pairings(listener)`: register `listener(*anything)` to be called when a
      request arrives or ends, so the menu shows it at once (else within the 0.5 s poll).
    """

    access_token: Callable[[], str | None] = _no_token
    pending_pairings: Callable[[], Sequence[PairingLike]] = _no_pairings
    approve_pairing: Callable[[str], Any] = _no_pairing_action
    deny_pairing: Callable[[str], Any] = _no_pairing_action
    subscribe_pairings: Callable[[Callable[..., None]], None] = _no_subscription
    notice: Callable[[], str | None] = _no_notice  # a service-level problem to show on top of the menu


def tray_hooks(daemon: Daemon) -> TrayHooks:
    """The owner token, pairing requests and keyring trouble of a live daemon (`daemon.auth`)."""
    auth = daemon.auth

    def keyring_notice() -> str | None:
        error = auth.tokens.keyring_error
        return None if error is None else f"Keyring unavailable: {error.reason}"

    return TrayHooks(
        access_token=lambda: auth.tokens.owner_secret,
        pending_pairings=auth.pairings.pending_pairings,
        approve_pairing=auth.pairings.approve,
        deny_pairing=auth.pairings.deny,
        subscribe_pairings=auth.pairings.add_listener,
        notice=keyring_notice,
    )


def pairing_notification(view: Any) -> str | None:
    """The desktop notification for a new pairing request (None for other changes)."""
    if getattr(view, "status", None) != "pending":
        return None
    scopes = ", ".join(clean_text(str(s), 32) for s in view.scopes) or "no scopes"
    return (
        f"{clean_text(view.app_name, 40)} asks for a token ({scopes}). Code {clean_text(view.user_code, 12)}: "
        f"approve or deny it in the lmsp-tray menu."
    )


def crash_notification(model_id: str, error: Any) -> str | None:
    """The desktop notification for a model whose process died (None for other errors: a failed
    load answers the click or request that caused it)."""
    if getattr(error, "code", None) != "model_crashed":
        return None
    return clean_text(f"{getattr(error, 'detail', '') or model_id + ' stopped.'}", 240)


# -- the backend ------------------------------------------------------------------------------------


class DaemonTrayBackend:
    """`TrayBackend` over a live `Daemon`. Every method is thread-safe; load/unload block."""

    def __init__(self, daemon: Daemon, autostart: Autostart, hooks: TrayHooks | None = None) -> None:
        self.daemon = daemon
        self.autostart = autostart
        self.hooks = hooks if hooks is not None else TrayHooks()
        self._autostart_failing = False

    # -- state ------------------------------------------------------------------------------------
    def snapshot(self) -> TrayState:
        """The catalog's models with their live states; cheap (no disk reads but the autostart entry)."""
        d = self.daemon
        models = tuple(self._model_view(entry) for entry in d.catalog.entries())
        enabled, supported = self._autostart_status()
        return TrayState(
            url=d.url,
            models=models,
            autostart_enabled=enabled,
            autostart_supported=supported,
            pairings=self._pairings(),
            token_available=self._token_available(),
            notice=self._notice(),
        )

    def _model_view(self, entry: Any) -> ModelView:
        info = entry.info
        view = ModelView(entry.id, entry.size_bytes, info.quantization if info else None)
        if entry.error:  # the file itself cannot be used (bad header, missing split part)
            return ModelView(view.id, view.size_bytes, view.quantization, MODEL_ERROR, entry.error)
        state, error = self.daemon.models.state(entry.id)
        reason = None
        if state == MODEL_ERROR:
            reason = (error.detail if isinstance(error, LMSPError) else str(error or "")) or "could not load"
        loaded = self.daemon.models.get(entry.id)
        generating = loaded is not None and loaded.busy
        return ModelView(view.id, view.size_bytes, view.quantization, state, reason, generating)

    def _autostart_status(self) -> tuple[bool, bool]:
        try:
            supported = self.autostart.supported
            enabled = supported and self.autostart.is_enabled()
        except Exception as exc:  # noqa: BLE001 - an unreadable entry must not break the menu
            if not self._autostart_failing:
                log.warning("cannot read the start-at-login setting: %s", short_reason(exc, 120))
            self._autostart_failing = True
            return False, False
        self._autostart_failing = False
        return enabled, supported

    def _pairings(self) -> tuple[PairingView, ...]:
        try:
            pending = self.hooks.pending_pairings()
        except Exception as exc:  # noqa: BLE001
            log.debug("pairing requests unavailable: %s", exc)
            return ()
        return tuple(
            PairingView(str(p.id), str(p.app_name or ""), tuple(str(s) for s in p.scopes or ()), str(p.user_code or ""))
            for p in pending
        )

    def _notice(self) -> str | None:
        try:
            return self.hooks.notice()
        except Exception as exc:  # noqa: BLE001
            log.debug("notice unavailable: %s", exc)
            return None

    def _token_available(self) -> bool:
        # Only whether the hook is connected: asking the keyring every 0.5 s is too slow
        # (0.1-0.3 s per call); a missing secret is reported when the user clicks.
        return self.hooks.access_token is not _no_token

    # -- actions ----------------------------------------------------------------------------------
    def _entry(self, model_id: str) -> Any:
        entry = self.daemon.catalog.get(model_id)
        if entry is None:
            raise ModelNotFound(f"'{model_id}' is no longer in the models folders; choose Rescan models.")
        return entry

    def load_model(self, model_id: str) -> None:
        """Load (blocking, seconds for a big model); the keep-alive is the same as an API load."""
        self.daemon.models.acquire(self._entry(model_id))

    def unload_model(self, model_id: str) -> None:
        """Unload once its running requests have finished (also clears a failed load)."""
        self.daemon.models.unload(model_id, drain=True)

    def unload_all(self) -> None:
        self.daemon.models.unload_all(drain=True)

    def rescan(self) -> None:
        self.daemon.watcher.rescan()

    def models_folder(self) -> Path:
        return self.daemon.paths.models_dir

    def access_token(self) -> str | None:
        return self.hooks.access_token()

    def set_autostart(self, enabled: bool) -> None:
        self.autostart.set(enabled)

    def approve_pairing(self, pairing_id: str) -> None:
        self.hooks.approve_pairing(pairing_id)

    def deny_pairing(self, pairing_id: str) -> None:
        self.hooks.deny_pairing(pairing_id)

    def quit(self) -> None:
        """The user chose Quit: end open streams with a terminal event, stop serving, unload."""
        log.info("Quit chosen in the tray, shutting down")
        self.daemon.stop_background()


# -- running --------------------------------------------------------------------------------------


def run_tray(
    daemon: Daemon,
    sock: socket.socket,
    *,
    autostart: Autostart | None = None,
    hooks: TrayHooks | None = None,
    announce: str | None = None,
) -> int:
    """The tray on this (main) thread, the API on a background thread; returns the exit code.

    Prints `announce` once the tray is up. When the tray cannot be shown after
    all (no toolkit, the display refuses us), prints one line saying so
    instead and serves headless.
    """
    from lmsp_tray.desktop.autostart import Autostart
    from lmsp_tray.desktop.system import headless_message
    from lmsp_tray.desktop.tray import TrayApp, TrayUnavailable, load_pystray

    backend = DaemonTrayBackend(
        daemon, autostart or Autostart.for_platform(), hooks if hooks is not None else tray_hooks(daemon)
    )
    try:
        app = TrayApp(backend, pystray=load_pystray())
    except Exception as exc:  # noqa: BLE001 - TrayUnavailable, or a toolkit refusing to start
        reason = (
            str(exc)
            if isinstance(exc, TrayUnavailable)
            else f"the system tray is not available ({short_reason(exc, 120)})"
        )
        print(headless_message(daemon.url, reason), file=sys.stderr, flush=True)
        daemon.serve_forever(sock)
        return 0

    if announce:
        print(announce, file=sys.stderr, flush=True)
    daemon.start_background(sock)
    refresh: Callable[..., None] = lambda *_: app.refresh()
    daemon.models.subscribe(refresh)
    daemon.watcher.subscribe(refresh)

    def notify_pairing(view: Any = None, *_: Any) -> None:
        message = pairing_notification(view)
        if message is not None:
            app.notify(message)

    def notify_crash(model_id: str, state: str) -> None:
        if state == MODEL_ERROR:
            message = crash_notification(model_id, daemon.models.state(model_id)[1])
            if message is not None:
                app.notify(message)

    daemon.models.subscribe(notify_crash)

    try:
        backend.hooks.subscribe_pairings(refresh)
        backend.hooks.subscribe_pairings(notify_pairing)
    except Exception as exc:  # noqa: BLE001
        log.debug("no pairing notifications: %s", exc)
    try:
        try:
            return app.run()
        except TrayUnavailable as exc:
            print(headless_message(daemon.url, str(exc)), file=sys.stderr, flush=True)
            _wait_for_signal(daemon)
            return 0
    finally:
        daemon.stop_background()  # a no-op after Quit; after SIGTERM/SIGINT the same clean stop


def _wait_for_signal(daemon: Daemon) -> None:
    """Keep serving (the tray died) until SIGTERM/SIGINT or the server stops."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5) and daemon.serving:
        pass
