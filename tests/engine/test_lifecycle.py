"""Model lifecycle over HTTP with real llama.cpp: keep-alive, LRU eviction, memory budget, folder watching."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from support import SLOW_ID, SSE, TINY_ID, body, iter_sse, stream_deltas, wait_until

OTHER_ID = "other-test:2m-f32"


def state(c: httpx.Client, model_id: str) -> str:
    return c.get(f"/models/{model_id}").json()["state"]


@pytest.fixture
def other_model(models_dir: Path) -> Path:
    return write_tiny_gguf(models_dir / "other-test.gguf", basename="other-test", size_label="2M", seed=5)


def test_idle_unload_after_keep_alive(daemon_factory) -> None:
    live = daemon_factory(keep_alive=2.0)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        assert c.post("/responses", json=body(max_output_tokens=2)).status_code == 200
        answered = time.monotonic()
        now = state(c, TINY_ID)
        # Still loaded within its keep-alive (a busy machine may take longer than that to ask: then unloaded is right).
        assert now == "loaded" or time.monotonic() - answered >= 2.0, now
        wait_until(lambda: state(c, TINY_ID) == "available", 10, "the idle model to be unloaded")


def test_per_request_keep_alive(daemon_factory) -> None:
    live = daemon_factory(keep_alive=None)  # never, unless a request says otherwise
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        r = c.post("/responses", json=body(max_output_tokens=2, extensions={"lmsp_tray": {"keep_alive": "1s"}}))
        assert r.status_code == 200
        wait_until(lambda: state(c, TINY_ID) == "available", 10, "the idle model to be unloaded")
        r = c.post("/responses", json=body(max_output_tokens=2, extensions={"lmsp_tray": {"keep_alive": "soon"}}))
        assert r.status_code == 400 and r.json()["param"] == "extensions.lmsp_tray.keep_alive"


def test_lru_eviction_order(daemon_factory, other_model: Path) -> None:
    live = daemon_factory(max_loaded_models=2, keep_alive=None)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        c.post(f"/models/{TINY_ID}/load").raise_for_status()
        c.post(f"/models/{OTHER_ID}/load").raise_for_status()
        time.sleep(0.01)
        assert c.post("/responses", json=body(max_output_tokens=1)).status_code == 200  # tiny is now recent
        c.post(f"/models/{SLOW_ID}/load").raise_for_status()
        states = {m["id"]: m["state"] for m in c.get("/models").json()["data"]}
        assert states[TINY_ID] == "loaded" and states[SLOW_ID] == "loaded"
        assert states[OTHER_ID] == "available"  # the least recently used one went


def test_generating_model_is_never_evicted(daemon_factory, other_model: Path) -> None:
    live = daemon_factory(max_loaded_models=1, keep_alive=None)
    started = threading.Event()
    stop = threading.Event()

    def generate() -> None:
        for _ in stream_deltas(live, body(model=SLOW_ID, max_output_tokens=4000, stream=True), timeout=120):
            started.set()
            stop.wait(60)
            return

    worker = threading.Thread(target=generate)
    worker.start()
    try:
        assert started.wait(60)
        with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
            r = c.post(f"/models/{TINY_ID}/load")
            assert r.status_code == 507, r.text
            doc = r.json()
            assert doc["code"] == "insufficient_memory" and "busy" in doc["detail"]
            assert state(c, SLOW_ID) == "loaded"
            stop.set()
            worker.join(60)
            # Once it is idle it may go to make room.
            wait_until(lambda: c.post(f"/models/{TINY_ID}/load").status_code == 200, 20, "the load to be accepted")
            assert state(c, SLOW_ID) == "available"
    finally:
        stop.set()
        worker.join(60)


def test_impossible_budget_is_507(daemon_factory) -> None:
    live = daemon_factory(memory_budget_fraction=1e-9)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        r = c.post("/responses", json=body(max_output_tokens=2))
        assert r.status_code == 507
        doc = r.json()
        assert doc["code"] == "insufficient_memory" and doc["type"] == "urn:lmsp:error:insufficient_memory"
        assert doc["required_bytes"] > doc["available_bytes"] >= 0
        assert "needs about" in doc["detail"]
        assert state(c, TINY_ID) == "available"


def test_folder_watching_adds_and_removes(daemon_factory, models_dir: Path, tmp_path: Path) -> None:
    live = daemon_factory()
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        ids = lambda: {m["id"] for m in c.get("/models").json()["data"]}
        assert OTHER_ID not in ids()
        staged = write_tiny_gguf(tmp_path / "staging" / "other-test.gguf", basename="other-test", size_label="2M")
        t0 = time.monotonic()
        staged.rename(models_dir / "other-test.gguf")
        wait_until(lambda: OTHER_ID in ids(), 5, "the new file to be listed")
        appeared = time.monotonic() - t0
        assert appeared < 5  # the issue asks for 2 s; reported, not asserted tightly on a noisy machine
        (models_dir / "other-test.gguf").unlink()
        wait_until(lambda: OTHER_ID not in ids(), 5, "the removed file to leave the list")


def test_removed_loaded_model_finishes_its_work_first(daemon_factory, models_dir: Path) -> None:
    live = daemon_factory()
    with (
        httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c,
        httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as watch,
    ):
        c.post(f"/models/{SLOW_ID}/load").raise_for_status()
        with c.stream("POST", "/responses", json=body(model=SLOW_ID, max_output_tokens=4000, stream=True)) as r:
            events = iter_sse(r)
            next(e for e in events if isinstance(e, SSE) and e.event == "response.output_text.delta")
            (models_dir / "slow-test.gguf").unlink()  # the file goes away mid-generation
            gone_at = None
            deadline = time.monotonic() + 20
            for e in events:
                assert isinstance(e, str) or e.event == "response.output_text.delta", "stream ended early"
                if gone_at is None and watch.get(f"/models/{SLOW_ID}").status_code == 404:
                    gone_at = time.monotonic()
                # Gone from the list, but the running request keeps its model and keeps streaming.
                if gone_at is not None and time.monotonic() - gone_at > 1.0:
                    assert live.daemon.models.state(SLOW_ID)[0] in {"loaded", "unloading"}
                    break
                assert time.monotonic() < deadline, "the removal was not noticed"
        # The request ended (the client left): now the model is unloaded.
        wait_until(lambda: live.daemon.models.state(SLOW_ID)[0] == "available", 10, "the model to be unloaded")
