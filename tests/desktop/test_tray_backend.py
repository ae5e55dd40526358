"""`DaemonTrayBackend` over a real daemon: real llama.cpp on generated models, real HTTP, real files.

What the tray menu is built from (`snapshot()`) is checked against what the
API says (`GET /lmsp/v1/models`), and each menu action is checked by its
effect as an API client sees it. The GUI side is covered by
test_tray_logic.py (no display) and test_tray_xvfb.py (the real program
under Xvfb).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from support import SLOW_ID, SSE, TINY_ID, iter_sse, wait_until

from lmsp_tray.desktop.autostart import Autostart
from lmsp_tray.desktop.backend import DaemonTrayBackend, TrayHooks, tray_hooks
from lmsp_tray.desktop.menu import Action, ModelView, PairingView, build_menu, find_item
from lmsp_tray.errors import LMSPError, ModelNotFound


@pytest.fixture
def autostart(tmp_path: Path) -> Autostart:
    home = tmp_path / "desktop-home"
    home.mkdir()
    return Autostart.for_platform("linux", environ={}, home=home, command=["/opt/lmsp-tray/lmsp-tray"])


@pytest.fixture
def backend(daemon, autostart) -> DaemonTrayBackend:
    return DaemonTrayBackend(daemon.daemon, autostart)


def api_states(client: httpx.Client) -> dict[str, str]:
    return {m["id"]: m["state"] for m in client.get("/models").json()["data"]}


def views(backend: DaemonTrayBackend) -> dict[str, ModelView]:
    return {m.id: m for m in backend.snapshot().models}


def test_snapshot_matches_the_api(backend, client, daemon):
    state = backend.snapshot()
    assert state.url == daemon.url
    assert state.token_available is False and state.pairings == ()  # until security's hook is filled
    assert state.autostart_supported and not state.autostart_enabled
    api = client.get("/models").json()["data"]
    assert [m.id for m in state.models] == [m["id"] for m in api]
    for view, obj in zip(state.models, api):
        assert (view.size_bytes, view.quantization, view.state) == (
            obj["size_bytes"],
            obj["quantization"],
            obj["state"],
        )
    assert views(backend)[TINY_ID].quantization == "F32"


def test_load_and_unload_in_process_show_in_the_api(backend, client):
    backend.load_model(TINY_ID)  # blocks until loaded
    assert api_states(client)[TINY_ID] == "loaded"
    assert views(backend)[TINY_ID].state == "loaded"
    menu = build_menu(backend.snapshot())
    item = find_item(menu, "Models").find(TINY_ID)
    assert item.checked is True and item.action is Action.UNLOAD_MODEL
    assert find_item(menu, "Unload all").enabled

    backend.unload_model(TINY_ID)
    assert api_states(client)[TINY_ID] == "available"
    assert views(backend)[TINY_ID].state == "available"

    backend.load_model(TINY_ID)
    backend.load_model(SLOW_ID)
    assert {api_states(client)[m] for m in (TINY_ID, SLOW_ID)} == {"loaded"}
    backend.unload_all()
    assert set(api_states(client).values()) == {"available"}


def test_api_loads_show_in_the_snapshot(backend, client):
    client.post(f"/models/{TINY_ID}/load").raise_for_status()
    assert views(backend)[TINY_ID].state == "loaded"
    client.post(f"/models/{TINY_ID}/unload").raise_for_status()
    assert views(backend)[TINY_ID].state == "available"


def test_generating_follows_the_scheduler(backend, client):
    assert not views(backend)[SLOW_ID].generating
    with client.stream(
        "POST", "/responses", json={"model": SLOW_ID, "input": "x", "max_output_tokens": 3000, "stream": True}
    ) as r:
        events = iter_sse(r)
        next(e for e in events if isinstance(e, SSE) and e.event == "response.output_text.delta")
        assert views(backend)[SLOW_ID].generating
        label = find_item(build_menu(backend.snapshot()), "Models").find(SLOW_ID).text
        assert label.endswith("\u2014 generating")
    # Closing the stream cancels the generation within a step.
    wait_until(lambda: not views(backend)[SLOW_ID].generating, 30, "the generation to end")


def unknown_architecture(path: Path) -> Path:
    """Rename the architecture in a generated GGUF's header: discovery reads it, llama.cpp refuses it."""
    data = bytearray(path.read_bytes())
    at = data.index(b"general.architecture") + len(b"general.architecture")
    assert data[at : at + 4] == (8).to_bytes(4, "little")  # a string value follows
    size = int.from_bytes(data[at + 4 : at + 12], "little")
    data[at + 12 : at + 12 + size] = b"xlama"
    path.write_bytes(bytes(data))
    return path


def test_unreadable_file_and_failed_load_are_errors_with_a_reason(backend, models_dir, client):
    (models_dir / "broken.gguf").write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    unknown_architecture(write_tiny_gguf(models_dir / "odd-test.gguf", basename="odd-test", size_label="1M"))
    (models_dir / "slow-copy.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")  # a copy that has just begun
    backend.rescan()
    models = views(backend)
    state = backend.snapshot()
    # Files that are not models are listed apart, by file name, and not counted as models.
    assert not any(m.id.startswith(("broken", "slow-copy")) for m in models.values())
    problems = {p.file_name: p for p in state.problems}
    assert set(problems) == {"broken.gguf", "slow-copy.gguf"}
    assert (
        problems["broken.gguf"].reason.startswith("not a GGUF model file") and "ZIP" in problems["broken.gguf"].reason
    )
    assert not problems["broken.gguf"].incomplete and problems["slow-copy.gguf"].incomplete
    assert problems["slow-copy.gguf"].reason.startswith("incomplete file, probably a download or copy")
    menu = build_menu(state)
    assert menu[0].text.endswith(f"0 of {len(models)} models loaded")
    files = find_item(menu, "Files that are not usable (2)")
    assert [i.text for i in files.submenu] == ["broken.gguf \u2014 not usable", "slow-copy.gguf \u2014 incomplete"]
    api_ids = {m["id"] for m in client.get("/models").json()["data"]}
    assert "broken" in api_ids and not any(i.startswith("slow-copy") for i in api_ids)  # no id for an incomplete one

    odd = models["odd-test:1m-f32"]
    assert odd.state == "available"
    with pytest.raises(LMSPError) as failed:
        backend.load_model(odd.id)  # real llama.cpp refuses the architecture
    odd = views(backend)[odd.id]
    assert odd.state == "error" and odd.error == failed.value.detail
    api = client.get(f"/models/{odd.id}").json()
    assert api["state"] == "error" and api["error"]["detail"] == odd.error
    item = find_item(build_menu(backend.snapshot()), "Models").find(odd.id)
    assert item.text.endswith("\u26a0 could not load")
    reason = " ".join(i.text for i in item.submenu if not i.separator and i.action is None)
    assert reason == odd.error and "llama.cpp could not load" in reason  # the whole reason, one level down
    retry = item.find("Try again")
    assert (retry.action, retry.arg) == (Action.LOAD_MODEL, odd.id)
    # Unloading a failed model clears the error.
    backend.unload_model(odd.id)
    assert views(backend)[odd.id].state == "available"


def test_missing_model_is_a_clear_error(backend):
    with pytest.raises(ModelNotFound, match="Rescan"):
        backend.load_model("no-such-model:1b")


def test_rescan_finds_new_files_and_tells_listeners(backend, models_dir, daemon):
    changes: list[set[str]] = []
    daemon.daemon.watcher.subscribe(lambda _entries, added, _removed: changes.append(added))
    write_tiny_gguf(models_dir / "fresh-test.gguf", basename="fresh-test", size_label="1M", seed=9)
    backend.rescan()
    assert any(m.startswith("fresh-test") for m in views(backend))
    assert any(any(a.startswith("fresh-test") for a in added) for added in changes)


def test_models_folder_and_start_at_login(backend, daemon, autostart):
    assert backend.models_folder() == daemon.daemon.paths.models_dir
    backend.set_autostart(True)
    assert backend.snapshot().autostart_enabled
    desktop = autostart.backend.read()
    assert desktop.enabled and desktop.command == ("/opt/lmsp-tray/lmsp-tray",)
    backend.set_autostart(False)
    assert not backend.snapshot().autostart_enabled


@dataclass
class Pairing:
    id: str
    app_name: str
    scopes: tuple[str, ...]
    user_code: str


def test_security_hooks_reach_the_menu(daemon, autostart):
    pending = {"pair_1": Pairing("pair_1", "Notes", ("models:read",), "WDJB-MJHT")}
    answered: list[tuple[str, str]] = []
    listeners = []

    def answer(kind):
        def act(pairing_id: str) -> None:
            answered.append((kind, pairing_id))
            pending.pop(pairing_id)

        return act

    hooks = TrayHooks(
        access_token=lambda: "lmsp_secret",
        pending_pairings=lambda: list(pending.values()),
        approve_pairing=answer("approve"),
        deny_pairing=answer("deny"),
        subscribe_pairings=listeners.append,
    )
    backend = DaemonTrayBackend(daemon.daemon, autostart, hooks)
    state = backend.snapshot()
    assert state.token_available
    assert state.pairings == (PairingView("pair_1", "Notes", ("models:read",), "WDJB-MJHT"),)
    assert backend.access_token() == "lmsp_secret"
    backend.approve_pairing("pair_1")
    assert answered == [("approve", "pair_1")] and backend.snapshot().pairings == ()
    # The daemon's own hooks: its owner token, its pairing broker (tests/auth/test_pairing.py goes further).
    real = DaemonTrayBackend(daemon.daemon, autostart, tray_hooks(daemon.daemon))
    assert real.access_token() == daemon.owner_token and real.snapshot().pairings == ()
    assert real.snapshot().notice is None
    with pytest.raises(LMSPError, match="No pairing request"):
        real.deny_pairing("pair_x")
    # Without hooks: no token, no requests, and answering says why.
    plain = DaemonTrayBackend(daemon.daemon, autostart, TrayHooks())
    assert plain.access_token() is None and plain.snapshot().pairings == ()
    with pytest.raises(LMSPError, match="not supported"):
        plain.deny_pairing("pair_x")


def test_quit_stops_the_daemon_cleanly(daemon_factory, autostart):
    live = daemon_factory()
    backend = DaemonTrayBackend(live.daemon, autostart)
    discovery = live.daemon.paths.discovery_file
    wait_until(discovery.exists, 30, "the discovery file")
    backend.load_model(SLOW_ID)
    terminal: list[str] = []
    streaming = threading.Event()

    def stream() -> None:
        with (
            httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c,
            c.stream(
                "POST", "/responses", json={"model": SLOW_ID, "input": "x", "max_output_tokens": 4000, "stream": True}
            ) as r,
        ):
            for event in iter_sse(r):
                if isinstance(event, SSE):
                    if event.event == "response.output_text.delta":
                        streaming.set()
                    last = event.event
            terminal.append(last)

    reader = threading.Thread(target=stream)
    reader.start()
    assert streaming.wait(60)
    backend.quit()
    reader.join(30)
    assert terminal and terminal[0] in {"response.cancelled", "response.failed"}
    assert not live.daemon.serving
    assert live.daemon.models.loaded() == []
    assert not discovery.exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(live.url, timeout=2)
    backend.quit()  # a second stop (the command line's own clean-up) does nothing
