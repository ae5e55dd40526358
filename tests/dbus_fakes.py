"""Small D-Bus services a desktop would run, for the tests: `python tests/dbus_fakes.py KIND OUT.jsonl`.

Run on a private session bus (tests/desktop_support.py `DBusFake`); each appends the calls it gets
to OUT.jsonl and writes `OUT.jsonl.ready` once it owns its name.

- `watcher [--no-host]`: org.kde.StatusNotifierWatcher, what KDE's panel or GNOME's AppIndicator
  extension runs. Items (AppIndicator icons) register with it; it says whether a host (a panel that
  shows items) is registered. The test then talks to the registered item itself over the same bus.
- `filemanager`: org.freedesktop.FileManager1 (GNOME Files, Dolphin, Nemo, Thunar all implement
  it): ShowFolders / ShowItems / ShowItemProperties.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WATCHER_XML = """
<node>
  <interface name="org.kde.StatusNotifierWatcher">
    <method name="RegisterStatusNotifierItem"><arg type="s" direction="in"/></method>
    <method name="RegisterStatusNotifierHost"><arg type="s" direction="in"/></method>
    <property name="RegisteredStatusNotifierItems" type="as" access="read"/>
    <property name="IsStatusNotifierHostRegistered" type="b" access="read"/>
    <property name="ProtocolVersion" type="i" access="read"/>
    <signal name="StatusNotifierItemRegistered"><arg type="s"/></signal>
    <signal name="StatusNotifierItemUnregistered"><arg type="s"/></signal>
    <signal name="StatusNotifierHostRegistered"/>
  </interface>
</node>
"""
FILEMANAGER_XML = """
<node>
  <interface name="org.freedesktop.FileManager1">
    <method name="ShowFolders"><arg type="as" direction="in"/><arg type="s" direction="in"/></method>
    <method name="ShowItems"><arg type="as" direction="in"/><arg type="s" direction="in"/></method>
    <method name="ShowItemProperties"><arg type="as" direction="in"/><arg type="s" direction="in"/></method>
  </interface>
</node>
"""


def main() -> int:
    import gi

    gi.require_version("Gio", "2.0")
    from gi.repository import Gio, GLib

    kind, out = sys.argv[1], Path(sys.argv[2])
    host = "--no-host" not in sys.argv
    items: list[str] = []

    def record(doc: dict) -> None:
        with out.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(doc) + "\n")

    if kind == "watcher":
        name, path, xml = "org.kde.StatusNotifierWatcher", "/StatusNotifierWatcher", WATCHER_XML
    elif kind == "filemanager":
        name, path, xml = "org.freedesktop.FileManager1", "/org/freedesktop/FileManager1", FILEMANAGER_XML
    else:
        raise SystemExit(f"unknown kind {kind}")
    node = Gio.DBusNodeInfo.new_for_xml(xml)

    def on_call(conn, sender, _path, _iface, method, params, invocation):
        args = params.unpack()
        if method == "RegisterStatusNotifierItem":
            service = args[0]
            # An item may register with its object path only; then it lives at the sender.
            item = f"{sender}{service}" if service.startswith("/") else service
            items.append(item)
            record({"call": method, "arg": service, "sender": sender, "item": item})
            conn.emit_signal(None, path, name, "StatusNotifierItemRegistered", GLib.Variant("(s)", (item,)))
        else:
            record({"call": method, "args": list(args), "sender": sender})
        invocation.return_value(None)

    def on_get(_conn, _sender, _path, _iface, prop):
        if prop == "RegisteredStatusNotifierItems":
            return GLib.Variant("as", items)
        if prop == "IsStatusNotifierHostRegistered":
            return GLib.Variant("b", host)
        return GLib.Variant("i", 0)

    def on_bus(conn, _name):
        conn.register_object(path, node.interfaces[0], on_call, on_get if kind == "watcher" else None, None)

    def on_name(_conn, _name):
        Path(f"{out}.ready").write_text("ok")

    Gio.bus_own_name(Gio.BusType.SESSION, name, Gio.BusNameOwnerFlags.NONE, on_bus, on_name, lambda *_: loop.quit())
    loop = GLib.MainLoop()
    loop.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
