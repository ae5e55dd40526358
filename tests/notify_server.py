"""A minimal freedesktop notification server that records what it is sent (for the desktop tests).

Usage: `python tests/notify_server.py OUT.jsonl [--caps body,actions]` inside a D-Bus session.
It owns `org.freedesktop.Notifications`, answers Notify / CloseNotification / GetCapabilities /
GetServerInformation over the real bus, and appends each notification (app name, id, replaces
id, icon, summary, body, actions, hints) to OUT.jsonl. Writes `OUT.jsonl.ready` once it owns the
name.

Tests act as the person in front of the screen through its control interface on the same bus
(`org.lmsptest.NotifyControl` at `/control`): `Invoke(id, action_key)` emits `ActionInvoked`
(a click on a button), `Dismiss(id)` emits `NotificationClosed` with reason 2 (closed by the user).
`NotifyServer` below starts it from a test and reads what it recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import json_lines, wait_until

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
    <signal name="ActionInvoked"><arg type="u"/><arg type="s"/></signal>
    <signal name="NotificationClosed"><arg type="u"/><arg type="u"/></signal>
  </interface>
</node>
"""
CONTROL_XML = """
<node>
  <interface name="org.lmsptest.NotifyControl">
    <method name="Invoke"><arg type="u" direction="in"/><arg type="s" direction="in"/></method>
    <method name="Dismiss"><arg type="u" direction="in"/></method>
  </interface>
</node>
"""


def main() -> int:
    import gi

    gi.require_version("Gio", "2.0")
    from gi.repository import Gio, GLib

    out = Path(sys.argv[1])
    caps = ["body"]
    if "--caps" in sys.argv:
        caps = [c for c in sys.argv[sys.argv.index("--caps") + 1].split(",") if c]
    node = Gio.DBusNodeInfo.new_for_xml(XML)
    control = Gio.DBusNodeInfo.new_for_xml(CONTROL_XML)
    counter = [0]
    conn_box: list = []

    def record(doc: dict) -> None:
        with out.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, ensure_ascii=False) + "\n")

    def emit(member: str, args: GLib.Variant) -> None:
        conn_box[0].emit_signal(None, "/org/freedesktop/Notifications", "org.freedesktop.Notifications", member, args)

    def on_call(_conn, sender, _path, _iface, method, params, invocation):
        if method == "Notify":
            app, replaces, icon, summary, body, actions, hints, timeout = params.unpack()
            nid = replaces or (counter[0] + 1)
            counter[0] = max(counter[0], nid)
            record(
                {
                    "event": "notify",
                    "id": nid,
                    "app": app,
                    "replaces": replaces,
                    "icon": icon,
                    "summary": summary,
                    "body": body,
                    "actions": actions,
                    "hints": {k: (v if isinstance(v, (str, int, bool, float)) else str(v)) for k, v in hints.items()},
                    "timeout": timeout,
                    "sender": sender,
                }
            )
            invocation.return_value(GLib.Variant("(u)", (nid,)))
        elif method == "CloseNotification":
            (nid,) = params.unpack()
            record({"event": "close", "id": nid})
            invocation.return_value(None)
            emit("NotificationClosed", GLib.Variant("(uu)", (nid, 3)))
        elif method == "GetCapabilities":
            invocation.return_value(GLib.Variant("(as)", (caps,)))
        else:
            invocation.return_value(GLib.Variant("(ssss)", ("test-notify", "lmsp", "1.0", "1.2")))

    def on_control(_conn, _sender, _path, _iface, method, params, invocation):
        if method == "Invoke":
            nid, key = params.unpack()
            record({"event": "invoke", "id": nid, "action": key})
            emit("ActionInvoked", GLib.Variant("(us)", (nid, key)))
        else:
            (nid,) = params.unpack()
            record({"event": "dismiss", "id": nid})
            emit("NotificationClosed", GLib.Variant("(uu)", (nid, 2)))
        invocation.return_value(None)

    def on_bus(conn, _name):
        conn_box.append(conn)
        conn.register_object("/org/freedesktop/Notifications", node.interfaces[0], on_call, None, None)
        conn.register_object("/control", control.interfaces[0], on_control, None, None)

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


class NotifyServer:
    """This server as a child process on the bus at `address`; `records()` reads what it got."""

    def __init__(self, address: str, out: Path, caps: str = "body,actions") -> None:
        self.address = address
        self.out = out
        env = {"DBUS_SESSION_BUS_ADDRESS": address, "PATH": "/usr/bin:/bin", "NO_AT_BRIDGE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(out), "--caps", caps],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc

        def ready() -> bool:
            assert proc.poll() is None, "the test notification server exited"
            return Path(f"{out}.ready").exists()

        wait_until(ready, 30, "the test notification server to start", interval=0.05)

    def records(self, event: str = "notify") -> list[dict]:
        return [doc for doc in json_lines(self.out) if doc["event"] == event]

    def wait(self, match, timeout: float = 30, what: str = "a notification") -> dict:
        return wait_until(
            lambda: next((doc for doc in self.records() if match(doc)), None),
            timeout,
            lambda: f"{what}; got {self.records()}",
            interval=0.05,
        )

    def _control(self, member: str, signature: str, body: tuple) -> None:
        from jeepney import DBusAddress, new_method_call
        from jeepney.io.blocking import open_dbus_connection

        address = DBusAddress(
            "/control", bus_name="org.freedesktop.Notifications", interface="org.lmsptest.NotifyControl"
        )
        with open_dbus_connection(self.address) as conn:
            conn.send_and_get_reply(new_method_call(address, member, signature, body), timeout=10)

    def invoke(self, nid: int, key: str) -> None:
        """Click the button `key` of notification `nid`."""
        self._control("Invoke", "us", (nid, key))

    def dismiss(self, nid: int) -> None:
        self._control("Dismiss", "u", (nid,))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
