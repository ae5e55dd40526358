"""The desktop notifications the running service raises through the tray, and their texts.

Why a module: `lmsp_tray.desktop.backend` shows the daemon to the tray (`DaemonTrayBackend`);
what the person is told when something happens in the service while nobody looks at the menu is
a separate idea. `lmsp_tray.desktop.compose.run_tray` calls each `watch_*` once the tray is
built: a new pairing request raises a notification with Approve/Deny buttons where the
notification server has actions (else it points to the menu) and it closes again once the request
is answered or expires; the keyring working again, a download ending and a model whose process
crashed raise one each, and so does a GPU build that falls back to the CPU (no device at start-up,
or a model that ran out of GPU memory at load and runs with fewer layers there); `welcome` is the
first run's. The texts (`pairing_text`, `download_notification`, `crash_notification`,
`gpu_notification`) are plain functions, tested without a desktop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lmsp_tray.desktop.menu import LOADED, MODEL_ERROR, Action, clean_text, display_path, short_reason

if TYPE_CHECKING:
    from lmsp_tray.daemon import Daemon
    from lmsp_tray.desktop.tray import TrayApp

log = logging.getLogger("lmsp_tray.desktop.tray")


def pairing_text(view: Any, *, buttons: bool) -> tuple[str, str]:
    """(title, body) of the notification for a pending pairing request."""
    scopes = ", ".join(clean_text(str(s), 32) for s in view.scopes) or "no scopes"
    name = clean_text(view.app_name, 40)
    where = "" if buttons else " Approve or deny it in the lmsp-tray menu (Pairing requests)."
    body = f"It wants: {scopes}. Check that the app shows the code {clean_text(view.user_code, 12)}.{where}"
    return f"\u201c{name}\u201d asks for an lmsp-tray token", body


def download_notification(status: Any) -> str | None:
    """The desktop notification when a download ends (None while it runs)."""
    name = clean_text(getattr(status, "ref", ""), 80)
    state = getattr(status, "state", None)
    if state == "completed":
        model = getattr(status, "model_id", None)
        ready = f": ready as {clean_text(model, 60)}" if model else " into the Hugging Face cache"
        return f"Downloaded {name}{ready}."
    if state == "failed":
        return f"Download of {name} failed: {short_reason(getattr(status, 'error', None), 160)}"
    return None


def crash_notification(model_id: str, error: Any) -> str | None:
    """The desktop notification for a model whose process died (None for other errors: a failed
    load answers the click or request that caused it)."""
    if getattr(error, "code", None) != "model_crashed":
        return None
    return clean_text(f"{getattr(error, 'detail', '') or model_id + ' stopped.'}", 240)


def gpu_notification(devices: Any, model_id: str | None = None, fallback: str | None = None) -> str | None:
    """The desktop notification when a GPU build runs on the CPU: at start-up (`devices.cpu_fallback`:
    its backend sees no device), or for `model_id`, whose load ran out of GPU memory (`fallback`, the
    placement's `gpu_fallback`, names the GPU and llama.cpp's words). None when nothing fell back."""
    if model_id is not None:
        return clean_text(f"{model_id}: {fallback}.", 300) if fallback else None
    reason = getattr(devices, "cpu_fallback", None)
    return clean_text(f"{reason}.", 300) if reason else None


def welcome(app: TrayApp, daemon: Daemon) -> None:
    """The first run's notification: where models go, and that other apps' models are found too."""
    folder = display_path(daemon.paths.models_dir)
    usable = [e for e in daemon.catalog.entries() if e.ok]
    have = f"It found {len(usable)} model(s) already. " if usable else ""
    body = (
        f"{have}Put .gguf models in {folder}; they show up in the menu by themselves. Models of LM Studio, "
        f"Ollama, Hugging Face and llama.cpp are found where they are. Apps use {daemon.url}."
    )

    def on_action(key: str) -> None:
        if key == "open-folder":
            app.click(Action.OPEN_MODELS_FOLDER)

    app.notify(
        body,
        title="lmsp-tray is running",
        kind="welcome",
        actions=[("open-folder", "Open models folder")],
        on_action=on_action,
    )


def watch_pairings(app: TrayApp, subscribe: Callable[[Callable[..., None]], None]) -> None:
    """A notification per pending request, with Approve/Deny buttons where the server has actions;
    closed again once the request is answered (in the menu, by the CLI) or expires. `subscribe`
    registers a listener for pairing changes (`TrayHooks.subscribe_pairings`)."""
    shown: dict[str, int] = {}
    lock = threading.Lock()

    def answer(pairing_id: str, key: str) -> None:
        if key == "approve":
            app.perform(Action.APPROVE_PAIRING, pairing_id)
        elif key == "deny":
            app.perform(Action.DENY_PAIRING, pairing_id)
        else:  # a click on the notification itself: show the menu with the request
            app.show_yourself()

    def on_change(view: Any = None, *_: Any) -> None:
        app.refresh()
        pairing_id = str(getattr(view, "id", ""))
        if not pairing_id:
            return
        if getattr(view, "status", None) != "pending":
            with lock:
                nid = shown.pop(pairing_id, None)
            app.close_notification(nid)
            return
        buttons = app.notifier is not None and app.notifier.supports_actions
        title, body = pairing_text(view, buttons=buttons)
        nid = app.notify(
            body,
            title=title,
            kind=None,  # every request its own notification
            actions=[("approve", "Approve"), ("deny", "Deny")],
            on_action=lambda key: threading.Thread(
                target=answer, args=(pairing_id, key), name="tray-pairing", daemon=True
            ).start(),
        )
        if nid:
            with lock:
                shown[pairing_id] = nid

    try:
        subscribe(on_change)
    except Exception as exc:  # noqa: BLE001
        log.debug("no pairing notifications: %s", exc)


def watch_keyring(app: TrayApp, daemon: Daemon) -> None:
    """Tell the person when the keyring stops or starts working again (the menu says it too)."""
    tokens = getattr(getattr(daemon, "auth", None), "tokens", None)
    if tokens is None or not hasattr(tokens, "add_keyring_listener"):
        return

    def on_change(error: Any) -> None:
        app.refresh()
        if error is None:
            app.notify(
                "The OS keyring works again: the owner token and new tokens are kept there from now on.",
                title="lmsp-tray: keyring available",
                kind="notice",
            )

    tokens.add_keyring_listener(on_change)


def watch_downloads(app: TrayApp, daemon: Daemon) -> None:
    """A notification when a download ends (done or failed); the menu follows progress by its poll."""

    def on_download(status: Any) -> None:
        message = download_notification(status)
        if message is not None:
            app.refresh()
            app.notify(message, title="lmsp-tray: download", kind="download")

    downloads = getattr(daemon, "downloads", None)
    if downloads is not None:
        downloads.subscribe(on_download)


def watch_crashes(app: TrayApp, daemon: Daemon) -> None:
    """A notification when a model's process dies (a failed load answers its own click or request)."""

    def notify_crash(model_id: str, state: str) -> None:
        if state == MODEL_ERROR:
            message = crash_notification(model_id, daemon.models.state(model_id)[1])
            if message is not None:
                app.notify(message)

    daemon.models.subscribe(notify_crash)


def watch_gpu(app: TrayApp, daemon: Daemon) -> None:
    """A notification when a GPU build falls back to the CPU: once at start-up when its backend sees no
    device (unless the person set `gpu = "off"`), and for each load that ran out of GPU memory and
    retried with fewer layers or on the CPU (the log says both too)."""
    if getattr(daemon.config, "gpu", "auto") != "off":
        message = gpu_notification(daemon.devices)
        if message is not None:
            app.notify(message, title="lmsp-tray: the GPU is not used", kind="gpu")

    def on_load(model_id: str, state: str) -> None:
        if state != LOADED:
            return
        model = daemon.models.get(model_id)
        placement = getattr(model, "placement", None)
        message = gpu_notification(None, model_id, getattr(placement, "gpu_fallback", None))
        if message is not None:
            app.notify(message, title="lmsp-tray: fewer layers on the GPU", kind=f"gpu-{model_id}")

    daemon.models.subscribe(on_load)
