"""What each tray menu click does, and what the person is told when it worked or failed.

Why a module: `TrayApp` (`lmsp_tray.desktop.tray`) owns the icon, the poller and the toolkit
loop; this is the one place that knows what each `Action` means over the `TrayBackend`
(Load, Copy access token, Rescan, Open models folder…), the notification that says it is done
(`run_action`), and the title of the one that says it failed (`failure_prefix`). `TrayApp.perform`
runs an action on a worker thread and turns a raised error into that notification, a line in the
menu for `FAILURE_SECONDS` (not for the `QUIET` actions) and, for the `SERIOUS` ones, the
error icon. The access token goes from the backend straight to the clipboard, never elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmsp_tray.desktop.menu import Action, clean_text, status_text
from lmsp_tray.desktop.system import ClipboardError, OpenError, open_path

if TYPE_CHECKING:
    from lmsp_tray.desktop.tray import TrayApp

# Failed actions that concern the models turn the icon red; a folder that will not open does not.
SERIOUS = frozenset({Action.LOAD_MODEL, Action.UNLOAD_MODEL, Action.UNLOAD_ALL})
QUIET = frozenset({Action.OPEN_MODELS_FOLDER, Action.VIEW_LOGS, Action.SHOW_STATUS})  # notification only


def run_action(app: TrayApp, action: Action, arg: str | None) -> tuple[str, str] | None:
    """Do it; (title, body) of the notification that says it is done, or None for none.

    Blocks (a load takes seconds): `TrayApp.perform` calls it on a worker thread.
    """
    b = app.backend
    if action is Action.COPY_URL:
        if not app.state.url:
            raise RuntimeError("the service is not listening yet")
        app.clipboard.copy(app.state.url)
        return "Copied the URL", f"{app.state.url} is on the clipboard."
    if action is Action.OPEN_CONSOLE:
        b.open_console()
        return None
    if action is Action.LOAD_MODEL:
        b.load_model(need(arg))
        return f"Loaded {clean_text(need(arg), 60)}", "It answers requests now."
    if action is Action.UNLOAD_MODEL:
        b.unload_model(need(arg))
        return None
    if action is Action.UNLOAD_ALL:
        b.unload_all()
        return None
    if action is Action.RESCAN:
        b.rescan()
        snap = app.safe_snapshot()
        count = len(snap.models)
        extra = f"; {len(snap.problems)} file(s) are not usable" if snap.problems else ""
        return "Rescanned the models folders", f"Found {count} model{'s' if count != 1 else ''}{extra}."
    if action is Action.OPEN_MODELS_FOLDER:
        folder = b.models_folder()
        folder.mkdir(parents=True, exist_ok=True)
        app.opener(folder)
        return None
    if action is Action.VIEW_LOGS:
        log_file = app.log_file
        if log_file is None:
            raise OpenError("this run writes no log file")
        target = log_file if log_file.is_file() else log_file.parent
        open_path(target)
        return None
    if action is Action.SHOW_STATUS:
        return "lmsp-tray", status_text(app.overlay(app.safe_snapshot()))
    if action is Action.COPY_TOKEN:
        secret = b.access_token()
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
    if action is Action.SET_AUTOSTART:
        b.set_autostart(arg == "on")
        return "Start at login", "lmsp-tray will start at login." if arg == "on" else (
            "lmsp-tray will not start at login."
        )
    if action is Action.APPROVE_PAIRING:
        b.approve_pairing(need(arg))
        return "Pairing approved", "The app receives its token with its next poll."
    if action is Action.DENY_PAIRING:
        b.deny_pairing(need(arg))
        return "Pairing denied", "The app gets no token."
    if action is Action.CANCEL_DOWNLOAD:
        b.cancel_download(need(arg))
        return "Download cancelled", "What was fetched stays in the Hugging Face cache; pulling it again resumes."
    raise ValueError(f"unknown action {action!r}")


def failure_prefix(action: Action, arg: str | None) -> str:
    """The title of the notification (and the start of the menu line) when `action` failed."""
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
        Action.CANCEL_DOWNLOAD: "Could not cancel the download",
        Action.VIEW_LOGS: "Could not open the log file",
        Action.SHOW_STATUS: "Could not show the status",
    }.get(action, "Failed")


def need(arg: str | None) -> str:
    if not arg:
        raise ValueError("this menu item names no model or request")
    return arg


def is_user_error(exc: BaseException) -> bool:
    """Errors with a message meant for people (no traceback in the log needed)."""
    from lmsp_tray.errors import LMSPError

    return isinstance(exc, (LMSPError, ClipboardError, OpenError, OSError, RuntimeError, ValueError))
