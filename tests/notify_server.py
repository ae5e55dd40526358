"""A minimal freedesktop notification server that records what it is sent (for the tray tests).

Usage: `python tests/notify_server.py OUT.jsonl` inside a D-Bus session
(`dbus-run-session`). It owns `org.freedesktop.Notifications`, answers
Notify / CloseNotification / GetCapabilities / GetServerInformation, and
appends each notification's summary and body to OUT.jsonl. Writes
`OUT.jsonl.ready` once it owns the name.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gi

gi.require_version("Gio", "2.0")
from gi.repository import Gio, GLib

XML = """
<node>
  <interface name="org.freedesktop.Notifications">
    <method name="Notify">
      <arg type="s" direction="in"/><arg type="u" direction="in"/><arg type="s" direction="in"/>
      <arg type="s" direction="in"/><arg type="s" direction="in"/><arg type="as" direction="in"/>
      <arg type="a{sv}" direction="in"/><arg type="i" direction="in"/><arg type="u" direction="out"/>
    </method>
    <method name="CloseNotification"><arg type="u" direction="in"/></method>
    <method name="GetCapabilities"><arg type="as" direction="out"/></method>
    <method name="GetServerInformation">
      <arg type="s" direction="out"/><arg type="s" direction="out"/>
      <arg type="s" direction="out"/><arg type="s" direction="out"/>
    </method>
  </interface>
</node>
"""


def main() -> int:
    out = Path(sys.argv[1])
    node = Gio.DBusNodeInfo.new_for_xml(XML)
    counter = [0]

    def on_call(_conn, _sender, _path, _iface, method, params, invocation):
        if method == "Notify":
            app, _replaces, _icon, summary, body, *_ = params.unpack()
            counter[0] += 1
            with out.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"app": app, "summary": summary, "body": body}) + "\n")
            invocation.return_value(GLib.Variant("(u)", (counter[0],)))
        elif method == "CloseNotification":
            invocation.return_value(None)
        elif method == "GetCapabilities":
            invocation.return_value(GLib.Variant("(as)", (["body"],)))
        else:
            invocation.return_value(GLib.Variant("(ssss)", ("test-notify", "lmsp", "1.0", "1.2")))

    def on_bus(conn, _name):
        conn.register_object("/org/freedesktop/Notifications", node.interfaces[0], on_call, None, None)

    def on_name(_conn, _name):
        Path(f"{out}.ready").write_text("ok")

    Gio.bus_own_name(
        Gio.BusType.SESSION,
        "org.freedesktop.Notifications",
        Gio.BusNameOwnerFlags.NONE,
        on_bus,
        on_name,
        lambda *_: loop.quit(),
    )
    loop = GLib.MainLoop()
    loop.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
