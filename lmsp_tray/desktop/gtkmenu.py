"""The tray menu as real Gtk widgets, kept in step with the state even while it is open.

Why not pystray's menu code on the GTK backends: it builds a new `Gtk.Menu` on every change and
shows it only the next time the menu opens, so an open menu is a stale snapshot ("0 of 7 models
loaded" after an API load, "Loading…" after the load finished). Here the menu is built once from
`MenuItemSpec`s and then synced: an item whose spec is unchanged stays as it is, one whose only
the text changed gets the new text, and any other change replaces just that widget in place — the
menu stays open and keeps its position. A widget is never reused for a different action (its
click handler is bound to the spec it was made for), and check marks are only ever set while the
item is built: setting one later would activate the item.

Only `lmsp_tray.desktop` uses this; it imports Gtk lazily (pystray has already initialised it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lmsp_tray.desktop.menu import Action, MenuItemSpec

Click = Callable[[Action, "str | None"], None]


def _gtk() -> Any:
    import gi

    gi.require_version("Gtk", "3.0")
    from gi.repository import Gtk

    return Gtk


def build_menu(specs: Sequence[MenuItemSpec], click: Click) -> Any:
    """A new `Gtk.Menu` for `specs` (shown widgets; pop it up or hand it to an indicator)."""
    menu = _gtk().Menu.new()
    for spec in specs:
        menu.append(_item(spec, click))
    menu.show_all()
    return menu


def _item(spec: MenuItemSpec, click: Click) -> Any:
    Gtk = _gtk()
    if spec.separator:
        return Gtk.SeparatorMenuItem()
    if spec.checked is not None:
        item = Gtk.CheckMenuItem.new_with_label(spec.text)
        item.set_active(spec.checked)  # before the handler is connected: no activation
    else:
        item = Gtk.MenuItem.new_with_label(spec.text)
    if spec.submenu is not None:
        item.set_submenu(build_menu(spec.submenu, click))
        item.set_sensitive(spec.enabled)
    else:
        action, arg = spec.action, spec.arg
        if action is not None:
            item.connect("activate", lambda _w: click(action, arg))
        item.set_sensitive(spec.enabled and action is not None)
    item._lmsp_spec = spec  # what this widget was built for
    return item


def _same_kind(a: MenuItemSpec, b: MenuItemSpec) -> bool:
    """Whether a widget built for `a` can show `b` by changing its text (and submenu contents) only."""
    return (
        a.separator == b.separator
        and a.action == b.action
        and a.arg == b.arg
        and a.checked == b.checked
        and a.enabled == b.enabled
        and (a.submenu is None) == (b.submenu is None)
    )


def sync_menu(menu: Any, specs: Sequence[MenuItemSpec], click: Click) -> int:
    """Make the (possibly open) `menu` show `specs`; returns how many widgets were replaced or added."""
    Gtk = _gtk()
    changed = 0
    children = list(menu.get_children())
    for index, spec in enumerate(specs):
        widget = children[index] if index < len(children) else None
        old: MenuItemSpec | None = getattr(widget, "_lmsp_spec", None) if widget is not None else None
        if old == spec:
            continue
        if old is not None and widget is not None and _same_kind(old, spec):
            if not spec.separator:
                label = widget.get_child()
                if isinstance(label, Gtk.Label) and label.get_text() != spec.text:
                    label.set_text(spec.text)
                if spec.submenu is not None:
                    sub = widget.get_submenu()
                    if sub is None:
                        widget.set_submenu(build_menu(spec.submenu, click))
                    else:
                        changed += sync_menu(sub, spec.submenu, click)
            widget._lmsp_spec = spec
            continue
        fresh = _item(spec, click)
        if widget is not None:
            menu.remove(widget)
        menu.insert(fresh, index)
        fresh.show_all()
        changed += 1
    for extra in list(menu.get_children())[len(specs) :]:
        menu.remove(extra)
        changed += 1
    return changed


def popup(menu: Any, status_icon: Any = None) -> bool:
    """Open `menu` now: under the status icon when there is one, else at the pointer."""
    Gtk = _gtk()
    if menu is None:
        return False
    if menu.get_visible():
        return True
    time = Gtk.get_current_event_time()
    if status_icon is not None:
        menu.popup(None, None, Gtk.StatusIcon.position_menu, status_icon, 0, time)
    else:
        menu.popup(None, None, None, None, 0, time)
    return True
