"""What each tray menu click does, and what the person is told when it worked or failed.

Why a module: `TrayApp` (`lmsp_tray.desktop.tray`) owns the icon, the poller and the toolkit
loop; this is the one place that knows what each `Action` means over the service (Load, Copy
access token, Rescan, Open models folder…). `HANDLERS` is a table with one `Handler` per action:
what it does (returning the notification that says it is done), the title of the one that says it
failed, whether a failure turns the icon red (`SERIOUS`) and whether it leaves a line in the menu
(not the `QUIET` ones). The handlers see the tray only through `ActionHost`, the few members of
`TrayApp` they use, and the service through `ActionBackend`, the part of the tray's backend that
clicks call; so this module imports nothing of the tray. `TrayApp.perform` runs an action on a
worker thread and turns a raised error into that notification, a line in the menu and, for the
serious ones, the error icon. The access token goes from the backend straight to the clipboard,
never elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from lmsp_tray.desktop.menu import Action, TrayState, clean_text, status_text
from lmsp_tray.desktop.system import ClipboardError, OpenError, open_path

Done = tuple[str, str]  # (title, body) of the notification that says an action is done


class ActionBackend(Protocol):
    """What a click asks of the running service (`TrayBackend` adds the tray's snapshot and Quit).

    Every method may be called from any thread and may block; failures are raised as exceptions
    whose text is fit for the user (e.g. `LMSPError`).
    """

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

    def cancel_download(self, task_id: str) -> None: ...

    def set_ollama_port(self, enabled: bool) -> None:
        """Write `ollama_port` to config.toml (Ollama's port, or none); it applies at the next start."""
        ...


class Copier(Protocol):
    def copy(self, text: str) -> Any: ...


class ActionHost(Protocol):
    """What the handlers use of the tray (`TrayApp` is one)."""

    @property
    def backend(self) -> ActionBackend: ...

    @property
    def state(self) -> TrayState: ...

    @property
    def clipboard(self) -> Copier: ...

    @property
    def opener(self) -> Callable[[Path], Any]: ...

    @property
    def log_file(self) -> Path | None: ...

    def safe_snapshot(self) -> TrayState: ...

    def overlay(self, state: TrayState) -> TrayState: ...


@dataclass(frozen=True)
class Handler:
    """One action: `run` does it (blocking) and returns its notification, or None for none;
    `failure` is the title when it failed (``{name}``: the model or request, cleaned)."""

    run: Callable[[ActionHost, str | None], Done | None]
    failure: str
    serious: bool = False  # a failure concerns the models: the icon turns red
    quiet: bool = False  # a failure is a notification only, no line in the menu


def need(arg: str | None) -> str:
    if not arg:
        raise ValueError("this menu item names no model or request")
    return arg


def _copy_url(app: ActionHost, _arg: str | None) -> Done:
    if not app.state.url:
        raise RuntimeError("the service is not listening yet")
    app.clipboard.copy(app.state.url)
    return "Copied the URL", f"{app.state.url} is on the clipboard."


def _open_console(app: ActionHost, _arg: str | None) -> None:
    app.backend.open_console()


def _load_model(app: ActionHost, arg: str | None) -> Done:
    app.backend.load_model(need(arg))
    return f"Loaded {clean_text(need(arg), 60)}", "It answers requests now."


def _unload_model(app: ActionHost, arg: str | None) -> None:
    app.backend.unload_model(need(arg))


def _unload_all(app: ActionHost, _arg: str | None) -> None:
    app.backend.unload_all()


def _rescan(app: ActionHost, _arg: str | None) -> Done:
    app.backend.rescan()
    snap = app.safe_snapshot()
    count = len(snap.models)
    extra = f"; {len(snap.problems)} file(s) are not usable" if snap.problems else ""
    return "Rescanned the models folders", f"Found {count} model{'s' if count != 1 else ''}{extra}."


def _open_models_folder(app: ActionHost, _arg: str | None) -> None:
    folder = app.backend.models_folder()
    folder.mkdir(parents=True, exist_ok=True)
    app.opener(folder)


def _view_logs(app: ActionHost, _arg: str | None) -> None:
    log_file = app.log_file
    if log_file is None:
        raise OpenError("this run writes no log file")
    open_path(log_file if log_file.is_file() else log_file.parent)


def _show_status(app: ActionHost, _arg: str | None) -> Done:
    return "lmsp-tray", status_text(app.overlay(app.safe_snapshot()))


def _copy_token(app: ActionHost, _arg: str | None) -> Done:
    secret = app.backend.access_token()
    if not secret:
        raise RuntimeError("there is no access token yet")
    try:
        app.clipboard.copy(secret)
    finally:
        del secret
    body = "Paste it into your app as its bearer token; it has every scope, so keep it private."
    if app.state.token_session_only:
        body += " It works until lmsp-tray stops, because the OS keyring cannot keep it."
    return "Access token copied to the clipboard", body


def _set_autostart(app: ActionHost, arg: str | None) -> Done:
    app.backend.set_autostart(arg == "on")
    return "Start at login", "lmsp-tray will start at login." if arg == "on" else "lmsp-tray will not start at login."


def _approve_pairing(app: ActionHost, arg: str | None) -> Done:
    app.backend.approve_pairing(need(arg))
    return "Pairing approved", "The app receives its token with its next poll."


def _deny_pairing(app: ActionHost, arg: str | None) -> Done:
    app.backend.deny_pairing(need(arg))
    return "Pairing denied", "The app gets no token."


def _cancel_download(app: ActionHost, arg: str | None) -> Done:
    app.backend.cancel_download(need(arg))
    return "Download cancelled", "What was fetched stays in the Hugging Face cache; pulling it again resumes."


def _set_ollama_port(app: ActionHost, arg: str | None) -> Done:
    app.backend.set_ollama_port(arg == "on")
    view = app.safe_snapshot().ollama
    port = f" {view.port}" if view is not None else ""
    if arg == "on":
        return "Ollama's port", f"Saved: Ollama's apps reach lmsp-tray on port{port} from the next start of lmsp-tray."
    return "Ollama's port", f"Saved: lmsp-tray leaves port{port} alone from its next start."


HANDLERS: Mapping[Action, Handler] = MappingProxyType(
    {
        Action.COPY_URL: Handler(_copy_url, "Could not copy the URL"),
        Action.OPEN_CONSOLE: Handler(_open_console, "Could not open the console"),
        Action.LOAD_MODEL: Handler(_load_model, "Could not load {name}", serious=True),
        Action.UNLOAD_MODEL: Handler(_unload_model, "Could not unload {name}", serious=True),
        Action.UNLOAD_ALL: Handler(_unload_all, "Could not unload the models", serious=True),
        Action.RESCAN: Handler(_rescan, "Rescan failed"),
        # A folder that will not open does not turn the icon red, nor stays in the menu.
        Action.OPEN_MODELS_FOLDER: Handler(_open_models_folder, "Could not open the models folder", quiet=True),
        Action.VIEW_LOGS: Handler(_view_logs, "Could not open the log file", quiet=True),
        Action.SHOW_STATUS: Handler(_show_status, "Could not show the status", quiet=True),
        Action.COPY_TOKEN: Handler(_copy_token, "Could not copy the access token"),
        Action.SET_AUTOSTART: Handler(_set_autostart, "Could not change start at login"),
        Action.APPROVE_PAIRING: Handler(_approve_pairing, "Could not approve the pairing"),
        Action.DENY_PAIRING: Handler(_deny_pairing, "Could not deny the pairing"),
        Action.CANCEL_DOWNLOAD: Handler(_cancel_download, "Could not cancel the download"),
        Action.SET_OLLAMA_PORT: Handler(_set_ollama_port, "Could not change Ollama's port"),
    }
)
SERIOUS = frozenset(action for action, handler in HANDLERS.items() if handler.serious)
QUIET = frozenset(action for action, handler in HANDLERS.items() if handler.quiet)


def run_action(app: ActionHost, action: Action, arg: str | None) -> Done | None:
    """Do it; (title, body) of the notification that says it is done, or None for none.

    Blocks (a load takes seconds): `TrayApp.perform` calls it on a worker thread.
    """
    handler = HANDLERS.get(action)
    if handler is None:
        raise ValueError(f"unknown action {action!r}")
    return handler.run(app, arg)


def failure_prefix(action: Action, arg: str | None) -> str:
    """The title of the notification (and the start of the menu line) when `action` failed."""
    handler = HANDLERS.get(action)
    return handler.failure.format(name=clean_text(arg or "", 40)) if handler is not None else "Failed"


def is_user_error(exc: BaseException) -> bool:
    """Errors with a message meant for people (no traceback in the log needed)."""
    from lmsp_tray.errors import LMSPError

    return isinstance(exc, (LMSPError, ClipboardError, OpenError, OSError, RuntimeError, ValueError))
