"""Searching Hugging Face for GGUF models (`GET /lmsp/v1/hub/models`, `GET /hub/variants`) against the
fake Hub, through huggingface_hub's own `HfApi.list_models`: the figures a person chooses by, each
variant's size and fit, the vision projector; answers cached briefly; nothing asked before a search."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from hub_server import FakeHub
from hub_support import (  # noqa: F401 - fixtures
    NOQ4,
    TINY,
    c,
    fake_hub,
    hf_env,
    home,
    hub,
    hub_daemon,
)
from support import LiveDaemon, wait_task

pytestmark = pytest.mark.timeout(300)


def test_search_lists_gguf_repositories_with_their_figures_and_is_cached(
    c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub
) -> None:
    c.get("/models").raise_for_status()
    assert hub.searches == [] and hub.log == []  # nothing leaves the machine until a person searches
    found = c.get("/hub/models", params={"search": "GGUF"})
    assert found.status_code == 200, found.text
    rows = found.json()["data"]
    assert [r["repository"] for r in rows][:2] == [TINY, NOQ4]  # most downloaded first
    tiny = rows[0]
    assert tiny["downloads"] == 1200 and tiny["likes"] == 34 and tiny["updated_at"].startswith("2026-03-02")
    assert tiny["model"] == f"hf.co/{TINY}"
    assert hub.searches[0]["search"] == "GGUF" and hub.searches[0]["filter"] == "gguf"
    assert c.get("/hub/models", params={"search": "gguf"}).json()["data"] == rows  # from the cache
    assert len(hub.searches) == 1
    assert [r["repository"] for r in c.get("/hub/models", params={"search": "noq4"}).json()["data"]] == [NOQ4]
    assert c.get("/hub/models").status_code == 400


def test_variants_show_size_fit_and_projector_and_download_from_one(
    c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub, hf_env: Path
) -> None:
    doc = c.get("/hub/variants", params={"repository": TINY})
    assert doc.status_code == 200, doc.text
    listing = doc.json()
    labels = {v["label"]: v for v in listing["variants"]}
    assert set(labels) == {"Q4_K_M", "Q5_K_M", "Q8_0"} and listing["default"] == "Q4_K_M"
    assert listing["projector"] and listing["projector"].startswith("mmproj")
    assert labels["Q8_0"]["size_bytes"] > labels["Q5_K_M"]["size_bytes"] > labels["Q4_K_M"]["size_bytes"]
    assert len(labels["Q8_0"]["files"]) == 3
    for v in labels.values():
        assert v["fit"]["verdict"] in ("fits_in_ram", "full_gpu_offload", "partial_gpu_offload")
    task = c.post("/models/pull", json={"model": labels["Q5_K_M"]["model"]}).json()
    assert wait_task(c, task["id"], {"completed"})["status"] == "completed"
    assert "tiny-hub:1m-q5_k_m" in {m["id"] for m in c.get("/models").json()["data"]}


def test_search_needs_models_manage(hub_daemon: LiveDaemon, hub: FakeHub) -> None:
    tokens = hub_daemon.daemon.auth.tokens
    reader = tokens.create("reader", ["models:read"]).secret
    r = httpx.get(f"{hub_daemon.url}/hub/models", params={"search": "x"}, headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403 and hub.searches == []


def test_an_unreachable_hub_is_told_after_one_attempt() -> None:
    """A Hub that drops every connection: the search says so after one attempt. huggingface_hub's
    `list_models` retried five times with back-off (~23 s of a person waiting on the console's answer)."""
    import socket
    import threading

    from lmsp_tray.errors import LMSPError
    from lmsp_tray.hub.remote import HubClient

    attempts: list[int] = []
    done = threading.Event()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.1)

        def drop_each() -> None:
            while not done.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                attempts.append(1)
                conn.close()

        thread = threading.Thread(target=drop_each)
        thread.start()
        try:
            with pytest.raises(LMSPError) as failed:
                HubClient(f"http://127.0.0.1:{server.getsockname()[1]}", token=False).search("gemma", limit=5)
        finally:
            done.set()
            thread.join(10)
    assert failed.value.status == 502 and len(attempts) == 1, (failed.value, attempts)
