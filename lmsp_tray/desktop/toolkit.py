"""Loading pystray and adapting it: backend choice, icon sizes, menus, safe notifications.

pystray fixes its backend at first import and fails in several ways without a usable display;
everything that depends on which backend was picked lives here, so `tray` holds only the app's
behaviour. Only `desktop/` imports pystray and PIL.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, MutableMapping
from types import ModuleType
from typing import Any

from lmsp_tray.desktop.menu import Action, MenuItemSpec, short_reason

log = logging.getLogger("lmsp_tray.desktop.tray")

GTK_BACKENDS = ("gtk", "appindicator")


class TrayUnavailable(RuntimeError):
    """There is no usable system tray (no display, no toolkit); run headless instead."""


# -- toolkit ---------------------------------------------------------------------------------------


LINUX_BACKENDS = ("appindicator", "gtk", "xorg")  # pystray's own order of preference


def load_pystray(environ: MutableMapping[str, str] | None = None) -> ModuleType:
    """Import pystray, or raise `TrayUnavailable` with a one-line reason.

    pystray picks its backend at first import (`PYSTRAY_BACKEND` overrides
    it) and fails in several ways without a usable display: ImportError,
    ValueError (a missing AppIndicator namespace), Xlib.error.DisplayNameError.
    Its own fallback only moves on after an ImportError, so a desktop without
    the AppIndicator typelib (ValueError) would get no tray although GTK's
    works; on Linux, without `PYSTRAY_BACKEND`, each backend is tried in turn.
    """
    env = os.environ if environ is None else environ
    try:
        import pystray

        return pystray
    except Exception as exc:  # noqa: BLE001 - any failure means "no tray here"
        first = exc
    shown = first
    if not env.get("PYSTRAY_BACKEND") and sys.platform.startswith("linux"):
        for name in LINUX_BACKENDS:
            _forget_pystray()
            env["PYSTRAY_BACKEND"] = name  # read once, by this import
            try:
                import pystray

                log.info("pystray's default backend failed (%s); using %s", short_reason(first, 100), name)
                return pystray
            except Exception as exc:  # noqa: BLE001
                if name == "gtk":
                    shown = exc  # the one that works on most desktops says most about why not
            finally:
                env.pop("PYSTRAY_BACKEND", None)
        _forget_pystray()
    detail = short_reason(shown, 120) if str(shown) else type(shown).__name__
    raise TrayUnavailable(f"the system tray is not available ({detail})") from None


def _forget_pystray() -> None:
    """Drop a half-imported pystray so the next import starts again (and picks its backend again)."""
    for name in [m for m in sys.modules if m == "pystray" or m.startswith("pystray.")]:
        del sys.modules[name]


def backend_name(pystray: ModuleType) -> str:
    """`gtk`, `appindicator`, `xorg`, `darwin`, `win32` or `dummy`."""
    return pystray.Icon.__module__.rsplit(".", 1)[-1].lstrip("_")


def default_icon_size(backend: str) -> int:
    """The image size handed to pystray: the size it is most likely shown at, so it is not rescaled."""
    return {"win32": 32, "darwin": 44, "gtk": 24}.get(backend, 22)


def gtk_status_icon_size(panel_size: int) -> int:
    """The size a GtkStatusIcon shows an image at in a panel of `panel_size` pixels.

    GTK 3 rounds the panel size down to a stock icon size (16, 24, 32, 48) and
    shrinks bigger images to it (bilinear, blurry); drawing at exactly that
    size keeps the icon crisp. Measured under trayer: a 38 px slot shows 32 px.
    """
    fitting = [s for s in (16, 24, 32, 48) if s <= panel_size]
    return fitting[-1] if fitting else 16


class _SafeNotifier:
    """Wraps pystray's D-Bus notifier so a missing bus or notification daemon is not fatal.

    pystray 0.19.5's GTK backends create the notifier while starting (no
    session bus: the tray never starts) and close the last notification
    while stopping (no notification daemon: `GLib.Error` out of `run()`).
    """

    def __init__(self, factory: Callable[[], Any] | None) -> None:
        self._inner = None
        if factory is None:
            return
        try:
            self._inner = factory()
        except Exception as exc:  # noqa: BLE001
            log.info("desktop notifications are not available (%s)", short_reason(exc, 100))

    def notify(self, title: str, message: str, icon: Any) -> None:
        if self._inner is not None:
            try:
                self._inner.notify(title, message, icon)
            except Exception as exc:  # noqa: BLE001
                log.debug("notification not shown: %s", short_reason(exc, 100))

    def hide(self) -> None:
        if self._inner is not None:
            try:
                self._inner.hide()
            except Exception as exc:  # noqa: BLE001
                log.debug("notification not closed: %s", short_reason(exc, 100))


def icon_class(pystray: ModuleType) -> type:
    """pystray's Icon class, hardened on the GTK backends (see `_SafeNotifier`)."""
    base = pystray.Icon
    if backend_name(pystray) not in GTK_BACKENDS or not hasattr(base, "_initialize"):
        return base
    try:
        from pystray._util import notify_dbus

        factory: Callable[[], Any] | None = notify_dbus.Notifier
    except Exception:  # noqa: BLE001
        factory = None

    class HardenedIcon(base):  # type: ignore[misc,valid-type]
        def _initialize(self) -> None:
            # As pystray's GtkIcon._initialize, minus its SIGINT reset (TrayApp handles
            # SIGINT/SIGTERM on the GLib loop) and with a notifier that cannot fail.
            self._notifier = _SafeNotifier(factory)
            self._mark_ready()

    HardenedIcon.__name__ = HardenedIcon.__qualname__ = "Icon"
    HardenedIcon.__module__ = base.__module__
    return HardenedIcon


# -- pystray menu from specs ----------------------------------------------------------------------


def pystray_menu(
    pystray: ModuleType,
    specs: list[MenuItemSpec] | tuple[MenuItemSpec, ...],
    on_click: Callable[[Action, str | None], None],
    *,
    escape_ampersand: bool = False,
) -> Any:
    """A `pystray.Menu` for `specs`; clicking an item calls `on_click(action, arg)`."""

    def text_of(spec: MenuItemSpec) -> str:
        return spec.text.replace("&", "&&") if escape_ampersand else spec.text

    def item(spec: MenuItemSpec) -> Any:
        if spec.separator:
            return pystray.Menu.SEPARATOR
        if spec.submenu is not None:
            sub = pystray_menu(pystray, spec.submenu, on_click, escape_ampersand=escape_ampersand)
            return pystray.MenuItem(text_of(spec), sub, enabled=spec.enabled)
        action, arg = spec.action, spec.arg

        def clicked(_icon: Any, _item: Any) -> None:
            if action is not None:
                on_click(action, arg)

        checked = None if spec.checked is None else (lambda _item, value=spec.checked: value)
        return pystray.MenuItem(
            text_of(spec), clicked, checked=checked, enabled=spec.enabled and action is not None, default=spec.default
        )

    return pystray.Menu(*[item(s) for s in specs])


# -- the app --------------------------------------------------------------------------------------
