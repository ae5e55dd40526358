"""Desktop notifications over D-Bus (org.freedesktop.Notifications), with actions and their own ids.

Why not pystray's notifier: it gives every notification the same id (each replaces the last, so
a pairing request vanishes under "Copied …"), sets no application name, offers no actions and
exists only once the tray runs — while a start-up failure must be shown before there is a tray,
or when there never will be one.

`Notifier` talks to the session bus with jeepney (pure Python; keyring already depends on it on
Linux). Each `notify()` is a new notification unless it names one to replace; `actions` become
buttons where the server says it supports them (`GetCapabilities` has "actions"); a background
thread receives `ActionInvoked` and `NotificationClosed` and calls the callbacks given with the
notification. Nothing here raises: without a bus or a notification server `notify()` returns
None and logs why once. Other platforms have no such bus: the tray falls back to pystray's
balloon there.
"""

from __future__ import annotations

import html
import logging
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("lmsp_tray.desktop.notify")

APP_NAME = "lmsp-tray"
BUS_NAME = "org.freedesktop.Notifications"
OBJECT_PATH = "/org/freedesktop/Notifications"
INTERFACE = "org.freedesktop.Notifications"
LOW, NORMAL, CRITICAL = 0, 1, 2
CALL_TIMEOUT_S = 5.0

ActionCallback = Callable[[str], None]  # (action key)


@dataclass
class _Pending:
    on_action: ActionCallback | None
    on_closed: Callable[[], None] | None


def app_icon() -> str:
    """A picture for the notification: the app's PNG when there is one, else its theme icon name."""
    from lmsp_tray.desktop.icons import assets_dir

    folder = assets_dir()
    if folder is not None and (folder / "lmsp-tray-48.png").is_file():
        return str(folder / "lmsp-tray-48.png")
    return "lmsp-tray"  # installed into the icon theme by installers/linux/install.sh


class Notifier:
    """Sends notifications; thread-safe. Connects on first use; `close()` when done."""

    def __init__(self, app_name: str = APP_NAME, icon: str | None = None, *, bus: str = "SESSION") -> None:
        self.app_name = app_name
        self.icon = icon if icon is not None else app_icon()
        self.bus = bus
        self._lock = threading.Lock()
        self._router: Any = None
        self._failed: str | None = None
        self._caps: frozenset[str] | None = None
        self._pending: dict[int, _Pending] = {}
        self._listener: threading.Thread | None = None
        self._signals: Any = None
        self._stop = threading.Event()

    # -- connection -----------------------------------------------------------------------------
    def _connect(self) -> Any:
        """The router, connected and listening for action signals; None when notifications cannot work."""
        if self._router is not None or self._failed is not None:
            return self._router
        if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
            self._failed = "no freedesktop notifications on this platform"
            return None
        try:
            from jeepney import MatchRule
            from jeepney.bus_messages import message_bus
            from jeepney.io.threading import DBusRouter, open_dbus_connection

            router = DBusRouter(open_dbus_connection(self.bus))
        except Exception as exc:  # noqa: BLE001 - no bus, no jeepney, a refusing bus
            self._failed = f"no D-Bus session bus ({type(exc).__name__}: {exc})"
            log.info("desktop notifications are not available: %s", self._failed)
            return None
        try:
            for member in ("ActionInvoked", "NotificationClosed"):
                rule = MatchRule(type="signal", interface=INTERFACE, member=member, path=OBJECT_PATH)
                router.send_and_get_reply(message_bus.AddMatch(rule), timeout=CALL_TIMEOUT_S)
            q: queue.Queue[Any] = queue.Queue(maxsize=256)
            self._signals = router.filter(MatchRule(type="signal", interface=INTERFACE, path=OBJECT_PATH), queue=q)
        except Exception as exc:  # noqa: BLE001
            log.debug("no notification signals: %s", exc)
        self._router = router
        if self._signals is not None:
            self._listener = threading.Thread(target=self._listen, name="lmsp-notify", daemon=True)
            self._listener.start()
        return router

    def _call(self, member: str, signature: str | None = None, body: tuple = ()) -> Any:
        from jeepney import DBusAddress, MessageType, new_method_call

        router = self._connect()
        if router is None:
            raise ConnectionError(self._failed or "not connected")
        address = DBusAddress(OBJECT_PATH, bus_name=BUS_NAME, interface=INTERFACE)
        reply = router.send_and_get_reply(new_method_call(address, member, signature, body), timeout=CALL_TIMEOUT_S)
        if reply.header.message_type == MessageType.error:
            raise ConnectionError(f"{member}: {reply.header.fields.get(4, 'error')} {reply.body}")
        return reply.body

    def capabilities(self) -> frozenset[str]:
        """What the notification server supports ("actions", "body", "body-markup", …); empty if none runs."""
        with self._lock:
            if self._caps is None:
                try:
                    self._caps = frozenset(self._call("GetCapabilities")[0])
                except Exception as exc:  # noqa: BLE001
                    log.debug("no notification server: %s", exc)
                    return frozenset()
            return self._caps

    def available(self) -> bool:
        return bool(self.capabilities())

    @property
    def supports_actions(self) -> bool:
        return "actions" in self.capabilities()

    # -- sending --------------------------------------------------------------------------------
    def notify(
        self,
        summary: str,
        body: str = "",
        *,
        actions: Sequence[tuple[str, str]] = (),
        on_action: ActionCallback | None = None,
        on_closed: Callable[[], None] | None = None,
        replaces: int = 0,
        urgency: int = NORMAL,
        timeout_ms: int = -1,
        category: str | None = None,
        resident: bool = False,
    ) -> int | None:
        """Show a notification; its id (for `close` or `replaces`), or None when none could be shown.

        `actions` are (key, label) pairs, shown as buttons only where the server supports them;
        `on_action(key)` runs on a background thread when one is chosen ("default" is a click on
        the notification itself).
        """
        caps = self.capabilities()
        if not caps:
            return None
        if "body-markup" in caps:
            body = html.escape(body, quote=False)
        flat: list[str] = []
        if "actions" in caps:
            for key, label in actions:
                flat += [key, label]
        hints: dict[str, tuple[str, Any]] = {"urgency": ("y", urgency), "desktop-entry": ("s", APP_NAME)}
        if category:
            hints["category"] = ("s", category)
        if resident and "persistence" in caps:
            hints["resident"] = ("b", True)
        try:
            with self._lock:
                (nid,) = self._call(
                    "Notify",
                    "susssasa{sv}i",
                    (self.app_name, replaces, self.icon, summary, body, flat, hints, timeout_ms),
                )
                if on_action is not None or on_closed is not None:
                    self._pending[nid] = _Pending(on_action, on_closed)
        except Exception as exc:  # noqa: BLE001
            log.debug("notification not shown: %s", exc)
            return None
        return int(nid)

    def close(self, nid: int | None) -> None:
        if not nid:
            return
        try:
            with self._lock:
                self._call("CloseNotification", "u", (nid,))
        except Exception as exc:  # noqa: BLE001
            log.debug("notification %s not closed: %s", nid, exc)

    def shutdown(self) -> None:
        """Stop listening and close the connection (notifications already shown stay)."""
        self._stop.set()
        with self._lock:
            router, self._router = self._router, None
            self._failed = "closed"
        if self._signals is not None:
            self._signals.queue.put(None)
        if router is not None:
            try:
                router.close()
            except Exception as exc:  # noqa: BLE001
                log.debug("closing the bus connection: %s", exc)

    # -- signals --------------------------------------------------------------------------------
    def _listen(self) -> None:
        while not self._stop.is_set():
            msg = self._signals.queue.get()
            if msg is None:
                return
            member = msg.header.fields.get(3)  # HeaderFields.member
            try:
                if member == "ActionInvoked":
                    nid, key = msg.body
                    pending = self._pending.get(int(nid))
                    if pending is not None and pending.on_action is not None:
                        pending.on_action(str(key))
                elif member == "NotificationClosed":
                    nid = int(msg.body[0])
                    with self._lock:
                        pending = self._pending.pop(nid, None)
                    if pending is not None and pending.on_closed is not None:
                        pending.on_closed()
            except Exception:
                log.warning("notification callback failed", exc_info=True)


class Notices:
    """The tray's notifications: through `Notifier` where a server answers, else a fallback (pystray's
    balloon on Windows). One notification per kind: a new one of a kind replaces the last of that kind
    (two "Loaded …" in a row), never one of another kind (a pairing request stays under a "Copied …");
    kind None is always a new one. Never raises."""

    def __init__(self, notifier: Notifier | None, fallback: Callable[[str, str], None] | None = None) -> None:
        self.notifier = notifier
        self.fallback = fallback
        self._slots: dict[str, int] = {}

    def send(
        self,
        body: str,
        *,
        title: str = APP_NAME,
        kind: str | None = None,
        actions: Sequence[tuple[str, str]] = (),
        on_action: ActionCallback | None = None,
        on_closed: Callable[[], None] | None = None,
        critical: bool = False,
    ) -> int | None:
        """Show it; its id where the server gave one."""
        if self.notifier is not None and self.notifier.available():
            nid = self.notifier.notify(
                title,
                body,
                actions=actions,
                on_action=on_action,
                on_closed=on_closed,
                replaces=self._slots.get(kind, 0) if kind else 0,
                urgency=CRITICAL if critical else NORMAL,
            )
            if nid is not None:
                if kind:
                    self._slots[kind] = nid
                return nid
        if self.fallback is not None:
            try:
                self.fallback(body, title)
            except Exception as exc:  # noqa: BLE001 - no notification daemon is not an error
                log.debug("notification not shown: %s", exc)
        return None

    def close(self, nid: int | None) -> None:
        if self.notifier is not None and nid:
            self.notifier.close(nid)


def notify_once(summary: str, body: str = "", *, urgency: int = NORMAL) -> bool:
    """Show one notification from a short-lived process (start-up failures); True when shown."""
    notifier = Notifier()
    try:
        return notifier.notify(summary, body, urgency=urgency) is not None
    finally:
        notifier.shutdown()


def file_uri(path: Path) -> str:
    return path.resolve().as_uri()
