"""Runs the real tray (pystray, gtk backend) over a scripted test backend, for the Xvfb tests.

Usage: `python tests/tray_runner.py STATE_DIR` with DISPLAY and PYSTRAY_BACKEND=gtk set.

`FileBackend` is a temporary stand-in for the daemon that implements
`TrayBackend`: its models and token come from `STATE_DIR/setup.json`, every
call is appended to `events.jsonl`, and the test changes its state from
outside (as an API client would) by writing `control.json`. A model load
waits for `release-<id>` when `gate` is set, so the test sees "Loading…"
deterministically. "Start at login" uses the real `Autostart` (HOME is a temp
folder). The runner also dumps the *real* Gtk menu (labels, check marks,
sensitivity, whether it is open) and the shown icon state to `menu.json`
every 100 ms, read from the widgets on the GTK main loop (tests/gtk_probe.py).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=DeprecationWarning)  # Gtk.StatusIcon is deprecated, still works

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gtk_probe import start_menu_dump
from support import wait_until

from lmsp_tray.desktop.autostart import Autostart
from lmsp_tray.desktop.menu import ModelView, PairingView, TrayState, activity_for
from lmsp_tray.errors import ModelLoadFailed, ModelNotFound


class FileBackend:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        setup = json.loads((state_dir / "setup.json").read_text())
        self.url = setup.get("url")
        self.token = setup.get("token")
        self.fail = dict(setup.get("fail", {}))
        self.gate = bool(setup.get("gate", False))
        self.models = {m["id"]: ModelView(m["id"], m.get("size_bytes"), m.get("quantization")) for m in setup["models"]}
        self.pairings: dict[str, PairingView] = {}
        self.autostart = Autostart.for_platform()
        self.lock = threading.Lock()
        self._control_mtime = 0.0

    def record(self, event: str, arg: object = None) -> None:
        with self.lock, open(self.dir / "events.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": event, "arg": arg, "thread": threading.current_thread().name}) + "\n")

    def _set(self, model_id: str, **changes: object) -> None:
        with self.lock:
            m = self.models[model_id]
            self.models[model_id] = ModelView(**{**m.__dict__, **changes})

    def _apply_control(self) -> None:
        path = self.dir / "control.json"
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._control_mtime:
            return
        self._control_mtime = mtime
        control = json.loads(path.read_text())
        with self.lock:
            if "pairings" in control:
                self.pairings = {
                    p["id"]: PairingView(p["id"], p["app_name"], tuple(p["scopes"]), p["user_code"])
                    for p in control["pairings"]
                }
            for model_id, state in control.get("model_states", {}).items():
                m = self.models[model_id]
                self.models[model_id] = ModelView(**{**m.__dict__, "state": state})
            for model_id, flag in control.get("generating", {}).items():
                m = self.models[model_id]
                self.models[model_id] = ModelView(**{**m.__dict__, "generating": bool(flag)})

    # -- TrayBackend ------------------------------------------------------------------------------
    def snapshot(self) -> TrayState:
        self._apply_control()
        with self.lock:
            models = tuple(self.models.values())
            pairings = tuple(self.pairings.values())
        return TrayState(
            url=self.url,
            activity=activity_for(models),
            models=models,
            autostart_enabled=self.autostart.is_enabled(),
            autostart_supported=self.autostart.supported,
            pairings=pairings,
            token_available=bool(self.token),
        )

    def load_model(self, model_id: str) -> None:
        if model_id not in self.models:
            raise ModelNotFound(f"No model {model_id!r}.")
        self.record("load_start", model_id)
        self._set(model_id, state="loading", error=None)
        if self.gate:
            release = self.dir / f"release-{model_id}"
            wait_until(release.exists, 120, f"the test to release {model_id}", interval=0.05)
        if model_id in self.fail:
            self._set(model_id, state="error", error=self.fail[model_id])
            self.record("load_failed", model_id)
            raise ModelLoadFailed(self.fail[model_id])
        self._set(model_id, state="loaded")
        self.record("load_done", model_id)

    def unload_model(self, model_id: str) -> None:
        self._set(model_id, state="available", generating=False)
        self.record("unload", model_id)

    def unload_all(self) -> None:
        for model_id in list(self.models):
            self._set(model_id, state="available", generating=False)
        self.record("unload_all")

    def rescan(self) -> None:
        self.record("rescan")

    def models_folder(self) -> Path:
        return self.dir / "models"

    def access_token(self) -> str | None:
        self.record("access_token")
        return self.token

    def set_autostart(self, enabled: bool) -> None:
        self.autostart.set(enabled)
        self.record("set_autostart", enabled)

    def approve_pairing(self, pairing_id: str) -> None:
        with self.lock:
            self.pairings.pop(pairing_id)
        self.record("approve_pairing", pairing_id)

    def deny_pairing(self, pairing_id: str) -> None:
        with self.lock:
            self.pairings.pop(pairing_id)
        self.record("deny_pairing", pairing_id)

    def quit(self) -> None:
        self.record("quit")


def main() -> int:
    state_dir = Path(sys.argv[1])
    logging.basicConfig(
        level=logging.INFO,
        filename=state_dir / "tray.log",
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    backend = FileBackend(state_dir)
    from lmsp_tray.desktop.notify import Notifier
    from lmsp_tray.desktop.tray import TrayApp

    app = TrayApp(backend, opener=lambda path: backend.record("open_folder", str(path)), notifier=Notifier())
    start_menu_dump(app, state_dir)
    code = app.run()
    backend.record("exit", code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
