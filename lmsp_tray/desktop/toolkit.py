"""Loading pystray and adapting it: which backend, PyGObject, icon sizes, menus, clicks, titles.

pystray fixes its backend at first import and fails in several ways without a usable display;
everything that depends on which backend is used lives here, so `tray` holds only the app's
behaviour. Only `desktop/` imports pystray and PIL.

Choosing the backend on Linux (`choose_backend`), unless `PYSTRAY_BACKEND` says otherwise:

- **AppIndicator** (StatusNotifierItem over D-Bus) when a StatusNotifierWatcher with a host runs
  (KDE, GNOME with the AppIndicator extension, most Wayland panels) and its typelib is there;
- else **GTK's XEmbed status icon** on X11 (XFCE, MATE, LXDE, Cinnamon, trayer …); if no tray
  host owns `_NET_SYSTEM_TRAY_S<n>` yet the icon is made anyway (a panel may start after us at
  login) and the tray reports it is not shown until it is;
- **xorg** (an icon without a menu) only where PyGObject is missing, with a message that says so
  and what to install;
- **none** where nothing could show an icon (a Wayland session without a watcher): the caller
  serves headless and says so.

PyGObject: the distribution's `python3-gi` serves only its own Python, and pip builds PyGObject
only with compilers and headers. When `gi` cannot be imported, `ensure_gi` loads the
distribution's copy if it was built for this exact Python (same extension suffix) — only that
one package, not the rest of the system's site-packages.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from lmsp_tray.desktop.menu import Action, MenuItemSpec, short_reason

log = logging.getLogger("lmsp_tray.desktop.tray")

GTK_BACKENDS = ("gtk", "appindicator")
LINUX_BACKENDS = ("appindicator", "gtk", "xorg")  # pystray's own order of preference
SNI_WATCHERS = ("org.kde.StatusNotifierWatcher", "org.freedesktop.StatusNotifierWatcher")
INSTALL_GI = (
    "install PyGObject for a tray menu: on Debian/Ubuntu `sudo apt install python3-gi gir1.2-gtk-3.0 "
    "gir1.2-ayatanaappindicator3-0.1` (with the system's python3), or `pip install '.[tray]'` (needs "
    "libgirepository1.0-dev libcairo2-dev pkg-config gcc)"
)


class TrayUnavailable(RuntimeError):
    """There is no usable system tray (no display, no toolkit, no tray host); run headless instead."""


# -- PyGObject ---------------------------------------------------------------------------------------


def system_gi_folders() -> list[Path]:
    """Where distributions install PyGObject for their own Python."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return [
        Path("/usr/lib/python3/dist-packages"),  # Debian, Ubuntu
        Path(f"/usr/lib64/{version}/site-packages"),  # Fedora, openSUSE
        Path(f"/usr/lib/{version}/site-packages"),  # Arch, Fedora (noarch)
    ]


def ensure_gi(folders: Sequence[Path] | None = None) -> str | None:
    """Make `import gi` work if it can; None when it does, else why not (one clause)."""
    try:
        import gi

        return None
    except ImportError:
        pass
    if getattr(sys, "frozen", False):
        return "PyGObject is not part of this build"
    wanted = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so
    for folder in folders if folders is not None else system_gi_folders():
        if not (folder / "gi" / "__init__.py").is_file() or not (folder / "gi" / f"_gi{wanted}").is_file():
            continue
        spec = importlib.machinery.PathFinder.find_spec("gi", [str(folder)])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["gi"] = module
        try:
            spec.loader.exec_module(module)
            import gi.repository  # noqa: F401 - loads the C extension: proves it fits this Python
        except Exception as exc:  # noqa: BLE001 - any failure: this copy does not fit
            for name in [m for m in sys.modules if m == "gi" or m.startswith("gi.")]:
                del sys.modules[name]
            log.info("the system's PyGObject in %s does not load here: %s", folder, short_reason(exc, 120))
            continue
        log.info("using the system's PyGObject from %s", folder)
        return None
    return "PyGObject (the Python module gi) is not installed for this Python"


def typelib_available(namespace: str, version: str) -> bool:
    try:
        import gi

        gi.require_version(namespace, version)
        return True
    except (ImportError, ValueError):
        return False


def appindicator_available() -> bool:
    return typelib_available("AyatanaAppIndicator3", "0.1") or typelib_available("AppIndicator3", "0.1")


# -- what can show an icon here ----------------------------------------------------------------------


def sni_watcher(environ: MutableMapping[str, str] | None = None) -> tuple[bool, bool]:
    """(a StatusNotifierWatcher runs, a host that shows items is registered with it) on the session bus."""
    env = os.environ if environ is None else environ
    if not env.get("DBUS_SESSION_BUS_ADDRESS") and not env.get("XDG_RUNTIME_DIR"):
        return False, False
    try:
        from jeepney import DBusAddress, Properties
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection

        with open_dbus_connection(env.get("DBUS_SESSION_BUS_ADDRESS") or "SESSION") as conn:
            for name in SNI_WATCHERS:
                if not conn.send_and_get_reply(message_bus.NameHasOwner(name), timeout=2).body[0]:
                    continue
                address = DBusAddress("/StatusNotifierWatcher", bus_name=name, interface=name)
                reply = conn.send_and_get_reply(Properties(address).get("IsStatusNotifierHostRegistered"), timeout=2)
                host = bool(reply.body[0][1]) if reply.body and isinstance(reply.body[0], tuple) else False
                return True, host
    except Exception as exc:  # noqa: BLE001 - no bus: no watcher
        log.debug("no StatusNotifierWatcher: %s", exc)
    return False, False


def x11_tray(display: str | None) -> tuple[bool, bool]:
    """(the X display answers, an X11 system tray owns `_NET_SYSTEM_TRAY_S<screen>` on it)."""
    if not display:
        return False, False
    try:
        from Xlib import X
        from Xlib import display as xdisplay

        d = xdisplay.Display(display)
    except Exception as exc:  # noqa: BLE001 - no Xlib, a display that does not answer
        log.debug("X display %s: %s", display, exc)
        return False, False
    try:
        atom = d.intern_atom(f"_NET_SYSTEM_TRAY_S{d.get_default_screen()}")
        owner = d.get_selection_owner(atom)
        return True, bool(owner) and owner != X.NONE
    except Exception as exc:  # noqa: BLE001
        log.debug("no X11 tray on %s: %s", display, exc)
        return True, False
    finally:
        d.close()


def xembed_host(display: str | None) -> bool:
    """Whether an X11 system tray (XEmbed) runs on `display`."""
    return x11_tray(display)[1]


@dataclass(frozen=True)
class BackendChoice:
    """Which pystray backend to use; `name` None means no icon can be shown (`reason` says why)."""

    name: str | None
    reason: str | None = None  # no tray at all: why, for the one-line message
    note: str | None = None  # a tray with a limitation (no menu): what to tell the person
    host_seen: bool = True  # False: an X11 icon made while no tray host runs (it may come later)


NO_HOST = (
    "no system tray is running on this desktop (no StatusNotifier watcher, no X11 tray), e.g. stock GNOME: "
    "install the 'AppIndicator and KStatusNotifierItem Support' extension (Debian/Ubuntu: "
    "gnome-shell-extension-appindicator) and log in again"
)


def choose_backend(environ: MutableMapping[str, str] | None = None, platform: str | None = None) -> BackendChoice:
    """The backend for this session (see the module docstring); never raises."""
    env = os.environ if environ is None else environ
    platform = platform or sys.platform
    forced = env.get("PYSTRAY_BACKEND")
    if forced:
        if forced in GTK_BACKENDS:
            ensure_gi()
        note = f"PYSTRAY_BACKEND={forced}: this icon has no menu; {INSTALL_GI}" if forced == "xorg" else None
        return BackendChoice(forced, note=note)
    if not platform.startswith("linux") and not platform.startswith(("freebsd", "openbsd", "netbsd")):
        return BackendChoice("")  # pystray's own (win32, darwin)
    x11 = env.get("DISPLAY")
    x11_answers, x11_host = x11_tray(x11)
    if x11 and not x11_answers:
        if not env.get("WAYLAND_DISPLAY"):
            return BackendChoice(None, reason=f"the X display {x11} does not answer")
        x11 = None  # a Wayland session with a stale DISPLAY: only StatusNotifier can work
    gi_problem = ensure_gi()
    watcher, host = sni_watcher(env)
    if gi_problem is None:
        if watcher and host and appindicator_available():
            return BackendChoice("appindicator")
        if x11:
            seen = x11_host
            if watcher and host and not seen:
                note = (
                    "this panel shows StatusNotifier icons, but the AppIndicator typelib is missing "
                    "(Debian/Ubuntu: sudo apt install gir1.2-ayatanaappindicator3-0.1)"
                )
                return BackendChoice("gtk", note=note, host_seen=False)
            return BackendChoice("gtk", host_seen=seen)
        if watcher and host:
            return BackendChoice(
                None,
                reason="this panel shows StatusNotifier icons, but the AppIndicator typelib is missing "
                "(Debian/Ubuntu: sudo apt install gir1.2-ayatanaappindicator3-0.1)",
            )
        return BackendChoice(None, reason=NO_HOST)
    if x11 and x11_host:
        return BackendChoice("xorg", note=f"{gi_problem}, so the tray icon has no menu; {INSTALL_GI}")
    return BackendChoice(None, reason=f"no tray icon can be shown: {gi_problem}; {INSTALL_GI}")


# -- pystray -----------------------------------------------------------------------------------------


def load_pystray(environ: MutableMapping[str, str] | None = None, backend: str | None = None) -> ModuleType:
    """Import pystray with `backend` (or its own choice), or raise `TrayUnavailable` with a reason.

    pystray fails in several ways without a usable display: ImportError, ValueError (a missing
    AppIndicator namespace), Xlib.error.DisplayNameError. Its own fallback only moves on after an
    ImportError, so without a `backend`, on Linux each backend is tried in turn.
    """
    env = os.environ if environ is None else environ
    if backend:
        if backend == "gtk" and env.get("DISPLAY"):
            env.setdefault("GDK_BACKEND", "x11")  # XEmbed is X11: under Wayland, GTK's status icon is never shown
        _forget_pystray()
        previous = env.get("PYSTRAY_BACKEND")
        env["PYSTRAY_BACKEND"] = backend
        try:
            import pystray

            return pystray
        except Exception as exc:  # noqa: BLE001
            _forget_pystray()
            detail = short_reason(exc, 160) if str(exc) else type(exc).__name__
            raise TrayUnavailable(f"the system tray is not available ({backend}: {detail})") from None
        finally:
            if previous is None:
                env.pop("PYSTRAY_BACKEND", None)
            else:
                env["PYSTRAY_BACKEND"] = previous
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
    detail = short_reason(shown, 160) if str(shown) else type(shown).__name__
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


_LATIN1 = str.maketrans({"\u2014": "-", "\u2013": "-", "\u00b7": "-", "\u2026": "...", "\u26a0": "!", "\u2713": "+"})


def latin1_safe(text: str) -> str:
    """`text` as X11's WM_NAME can carry it (Latin-1): dashes and dots spelled out, the rest as '?'."""
    return text.translate(_LATIN1).encode("latin-1", "replace").decode("latin-1")


class _SafeNotifier:
    """Stands in for pystray's D-Bus notifier, which its GTK backends close while stopping.

    lmsp-tray sends its own notifications (`lmsp_tray.desktop.notify`); pystray's would all share
    one id. This keeps pystray's start and stop from failing without a session bus or a
    notification daemon (pystray 0.19.5 raises `GLib.Error` out of `run()` then).
    """

    def notify(self, title: str, message: str, icon: Any) -> None:
        log.debug("pystray notification ignored: %s", title)

    def hide(self) -> None:
        return None


@dataclass
class MenuHooks:
    """What the GTK icons ask the app for: the current menu, what a click does, what a left-click does."""

    specs: Callable[[], list[MenuItemSpec]]
    click: Callable[[Action, str | None], None]
    primary: Callable[[], bool] | None = None  # left-click; None, or False returned: open the menu


def icon_class(pystray: ModuleType, hooks: MenuHooks | None = None) -> type:
    """pystray's Icon class, adapted to the backend (see the classes below)."""
    base = pystray.Icon
    name = backend_name(pystray)
    if name in GTK_BACKENDS and hasattr(base, "_initialize") and hooks is not None:
        return _gtk_icon(base, name, hooks)
    if name == "xorg":
        return _xorg_icon(base)
    if name == "win32" and hasattr(base, "_on_notify"):
        return _win32_icon(base)
    return base


def _win32_icon(base: type) -> type:
    class Win32TrayIcon(base):
        """pystray's Windows icon, where a left-click opens the menu as a right-click does
        (Windows' own convention for notification-area icons with a menu)."""

        def _on_notify(self, wparam: Any, lparam: Any) -> Any:
            from pystray._util import win32

            if lparam == win32.WM_LBUTTONUP:
                lparam = win32.WM_RBUTTONUP
            return super()._on_notify(wparam, lparam)

    Win32TrayIcon.__name__ = Win32TrayIcon.__qualname__ = "Icon"
    Win32TrayIcon.__module__ = base.__module__
    return Win32TrayIcon


def _gtk_icon(base: type, name: str, hooks: MenuHooks) -> type:
    from lmsp_tray.desktop import gtkmenu

    class GtkTrayIcon(base):
        """pystray's GTK icons with lmsp-tray's menu: built once, synced in place (also while open);
        left-click opens the menu; the title is also the hover tooltip."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._lmsp_hooks = hooks
            super().__init__(*args, **kwargs)
            self._menu_handle = gtkmenu.build_menu(hooks.specs(), hooks.click)
            self._update_title()  # pystray sets it only on later changes

        def _initialize(self) -> None:
            # As pystray's GtkIcon._initialize, minus its SIGINT reset (TrayApp handles
            # SIGINT/SIGTERM on the GLib loop) and with a notifier that cannot fail.
            self._notifier = _SafeNotifier()
            self._mark_ready()

        def _update_menu(self) -> None:
            from gi.repository import GLib

            GLib.idle_add(self._lmsp_sync_menu)

        def _lmsp_sync_menu(self) -> bool:
            try:
                gtkmenu.sync_menu(self._menu_handle, self._lmsp_hooks.specs(), self._lmsp_hooks.click)
            except Exception:
                log.warning("could not update the tray menu", exc_info=True)
            return False

        def _update_title(self) -> None:
            from gi.repository import GLib

            def apply() -> bool:
                status_icon = getattr(self, "_status_icon", None)
                if status_icon is not None:
                    status_icon.set_title(self.title)
                    status_icon.set_tooltip_text(self.title)
                indicator = getattr(self, "_appindicator", None)
                if indicator is not None:
                    indicator.set_title(self.title)
                return False

            GLib.idle_add(apply)

        def _on_status_icon_activate(self, status_icon: Any) -> None:
            """A left-click: the app's primary action, else the menu (never a hidden default item)."""
            primary = self._lmsp_hooks.primary
            if primary is None or not primary():
                gtkmenu.popup(self._menu_handle, status_icon)

        def popup_menu(self) -> bool:
            """Open the menu now (main loop); False where the panel owns it (AppIndicator)."""
            status_icon = getattr(self, "_status_icon", None)
            if status_icon is None or not status_icon.is_embedded():
                return False
            return gtkmenu.popup(self._menu_handle, status_icon)

    GtkTrayIcon.__name__ = GtkTrayIcon.__qualname__ = "Icon"
    GtkTrayIcon.__module__ = base.__module__
    return GtkTrayIcon


def _xorg_icon(base: type) -> type:
    class XorgTrayIcon(base):
        """pystray's xorg icon with a Latin-1 window name (X11's WM_NAME; pystray writes it as
        Latin-1 and fails on an em dash), and clicks that arrive: pystray 0.19.5 handles ButtonPress
        but never asks X for it, so a click on its icon did nothing."""

        def _create_window(self) -> Any:
            window = super()._create_window()
            from Xlib import X

            window.change_attributes(event_mask=X.ExposureMask | X.StructureNotifyMask | X.ButtonPressMask)
            return window

        def _show(self) -> None:
            super()._show()
            threading.Thread(target=self._keep_docking, name="tray-xorg-dock", daemon=True).start()

        def _keep_docking(self) -> None:
            """pystray asks the tray host to dock the icon once; a request that arrives while the host
            is busy (or not yet listening) is lost and the icon never shows. Ask again, about once a
            second, until the window has been taken into the tray (its parent is no longer the root)."""
            for _ in range(60):
                time.sleep(1.0)
                try:
                    root = self._display.screen().root.id
                    if self._window.query_tree().parent.id != root:
                        return
                    self._dock_window()
                except Exception:  # noqa: BLE001 - the window or the display has gone (Quit)
                    return

        @property
        def title(self) -> str:
            return latin1_safe(str(self._title or ""))

        @title.setter
        def title(self, value: str) -> None:
            self._title = value
            if self.visible:
                self._update_title()

    XorgTrayIcon.__name__ = XorgTrayIcon.__qualname__ = "Icon"
    XorgTrayIcon.__module__ = base.__module__
    return XorgTrayIcon


# -- pystray menu from specs (backends without GTK) -----------------------------------------------------


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
