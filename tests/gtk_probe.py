"""Reads the real Gtk menu of a running `TrayApp` and writes it to `menu.json`, for the Xvfb tests.

Used inside the tray's own process: by `tray_runner.py` (the tray over a
scripted backend) and, through `probe_site/sitecustomize.py`, by the real
`lmsp-tray` program. Every 100 ms, on the GTK main loop, it dumps the menu
widgets (labels, check marks, sensitivity, whether the menu is open), the
icon state shown and whether the icon is embedded — what a user sees, read
from the toolkit rather than from lmsp-tray's own model of it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any


def dump_gtk_menu(menu: Any) -> list[dict]:
    from gi.repository import Gtk

    items = []
    for child in menu.get_children():
        if isinstance(child, Gtk.SeparatorMenuItem):
            items.append({"separator": True})
            continue
        label = child.get_child()
        entry = {
            "text": label.get_text() if label is not None else "",
            "sensitive": child.get_sensitive(),
            "checked": child.get_active() if isinstance(child, Gtk.CheckMenuItem) else None,
        }
        sub = child.get_submenu()
        if sub is not None:
            entry["submenu"] = dump_gtk_menu(sub)
            entry["submenu_open"] = sub.get_visible()
        items.append(entry)
    return items


def start_menu_dump(app: Any, state_dir: Path, interval_ms: int = 100) -> None:
    """Dump `app`'s menu to `state_dir/menu.json` whenever it changes (call before `app.run()`)."""
    from gi.repository import GLib

    last = [""]

    def dump() -> bool:
        try:
            menu = getattr(app.icon, "_menu_handle", None)
            status_icon = getattr(app.icon, "_status_icon", None)
            doc = {
                "open": bool(menu is not None and menu.get_visible()),
                "items": dump_gtk_menu(menu) if menu is not None else [],
                "activity": app._shown_activity,
                "title": app.icon.title,
                "icon_size": app.icon_size,
                "embedded": bool(status_icon is not None and status_icon.is_embedded()),
                "tooltip": status_icon.get_tooltip_text() if status_icon is not None else None,
                "toolkit": app.toolkit,
            }
            text = json.dumps(doc, ensure_ascii=False, sort_keys=True)
            if text != last[0]:
                last[0] = text
                tmp = state_dir / "menu.json.tmp"
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, state_dir / "menu.json")
        except Exception:
            logging.getLogger("gtk_probe").exception("menu dump failed")
        return True

    GLib.timeout_add(interval_ms, dump)
