"""`POST /lmsp/v1/models/pull` on a live daemon, against the fake Hub: a durable task with resumable events.

The daemon scans the default folders of a temporary home (so the Hugging Face
cache it downloads into is one discovery reads); the fake Hub counts the bytes
it serves and can pause a body, so cancel, shutdown and restart are checked
mid-file, deterministically.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest
from hub_server import FakeHub
from hub_support import (  # noqa: F401 - fixtures
    GATED,
    NOQ4,
    TINY,
    c,
    fake_hub,
    hf_env,
    home,
    hub,
    hub_daemon,
    iter_stream,
    wait_for_progress,
)
from support import SSE, LiveDaemon, MemoryVault, iter_sse, wait_task, wait_until

pytestmark = pytest.mark.timeout(300)

PULLED = "tiny-hub:1m-q4_k_m"


def read_events(c: httpx.Client, task_id: str, after: int | None = None, stop_after: int | None = None) -> list[SSE]:
    got: list[SSE] = []
    params = {} if after is None else {"after": after}
    with c.stream("GET", f"/tasks/{task_id}/events", params=params) as r:
        assert r.status_code == 200, r.read()
        for e in iter_sse(r):
            if isinstance(e, SSE):
                got.append(e)
                if stop_after is not None and len(got) >= stop_after:
                    break
    return got


def model_ids(c: httpx.Client) -> set[str]:
    return {m["id"] for m in c.get("/models").json()["data"]}


def test_the_last_progress_event_reaches_the_total_when_the_store_is_slow(
    hub_daemon: LiveDaemon, c: httpx.Client, hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transfer's final progress can arrive while an earlier one is still being written, as the
    transfer ends: it is still sent (it was dropped, and the bar stopped short of 100%)."""
    db = hub_daemon.daemon.downloads.db
    write = db.awrite

    async def slow_write(fn, /, *args, **kwargs):  # a busy disk under the task store
        await asyncio.sleep(0.25)
        return await write(fn, *args, **kwargs)

    monkeypatch.setattr(db, "awrite", slow_write)
    task = c.post("/models/pull", json={"model": f"hf.co/{TINY}"}).json()
    evs = read_events(c, task["id"])
    progress = [e.data for e in evs if e.event == "model.download.progress"]
    assert evs[-1].event == "model.download.completed"
    assert progress and progress[-1]["bytes_done"] == task["download"]["total_bytes"], progress


def test_pull_is_a_task_whose_events_end_with_the_model_listed(c: httpx.Client, hub: FakeHub, hf_env: Path) -> None:
    r = c.post("/models/pull", json={"model": f"hf.co/{TINY}"})
    assert r.status_code == 202, r.text
    task = r.json()
    assert r.headers["location"] == f"/lmsp/v1/tasks/{task['id']}"
    assert task["object"] == "task" and task["kind"] == "model.download" and task["response"] is None
    download = task["download"]
    assert download["model"] == f"hf.co/{TINY}:Q4_K_M" and download["quantization"] == "Q4_K_M"
    assert "default" in download["reason"]
    assert [f["path"] for f in download["files"]] == ["Tiny-Q4_K_M.gguf", "mmproj-F16.gguf"]
    assert download["fit"]["verdict"] in ("fits_in_ram", "full_gpu_offload", "partial_gpu_offload")
    evs = read_events(c, task["id"])
    assert [e.id for e in evs] == list(range(1, len(evs) + 1))
    names = [e.event for e in evs]
    assert names[0] == "model.download.created" and names[1] == "model.download.started"
    assert names[-1] == "model.download.completed" and set(names[2:-1]) == {"model.download.progress"}
    progress = [e.data for e in evs if e.event == "model.download.progress"]
    done = [p["bytes_done"] for p in progress]
    assert done == sorted(done) and progress[-1]["bytes_done"] == download["total_bytes"]
    assert all(e.data["type"] == e.event and e.data["sequence_number"] == e.id for e in evs)
    assert all(e.data["task_id"] == task["id"] for e in evs)
    final = evs[-1].data
    assert final["model"]["id"] == PULLED and final["model"]["source"] == "huggingface"
    assert final["download"]["model_id"] == PULLED and final["download"]["fit"]["estimated_from"] == "header"
    # Listed at once (no rescan asked for), usable at once.
    assert PULLED in model_ids(c)
    out = c.post("/responses", json={"model": PULLED, "input": "hello", "max_output_tokens": 4, "temperature": 0})
    assert out.status_code == 200 and out.json()["status"] == "incomplete"
    doc = c.get(f"/tasks/{task['id']}").json()
    assert doc["status"] == "completed" and doc["download"]["model_id"] == PULLED and doc["error"] is None
    # Resumable from any point, like any task's events.
    assert [e.id for e in read_events(c, task["id"], after=2)] == [e.id for e in evs[2:]]
    listed = c.get("/tasks").json()["data"]
    assert any(t["id"] == task["id"] and t["kind"] == "model.download" for t in listed)


def test_a_half_downloaded_model_is_never_listed_and_progress_shows_in_the_task(
    c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub
) -> None:
    path = "Tiny-Q5_K_M.gguf"
    pause = hub.pause(f"{TINY}/{path}", 400_000)
    task = c.post("/models/pull", json={"model": f"{TINY}:Q5_K_M", "include_mmproj": False}).json()
    assert pause.reached.wait(60)
    evs = read_events(c, task["id"], stop_after=4)
    assert evs[-1].event == "model.download.progress" and evs[-1].data["phase"] == "downloading"
    hub_daemon.daemon.watcher.rescan()  # what the folder watcher would do on the new files
    assert "tiny-hub:1m-q5_k_m" not in model_ids(c)
    doc = wait_task(c, task["id"], {"in_progress"})
    assert doc["download"]["progress"]["bytes_done"] > 0
    pause.release.set()
    assert wait_task(c, task["id"], {"completed"})["download"]["model_id"] == "tiny-hub:1m-q5_k_m"
    assert "tiny-hub:1m-q5_k_m" in model_ids(c)
    assert hub.downloaded[f"{TINY}/{path}"] == len(hub.repos[TINY].files[path])


def test_cancel_keeps_the_part_and_the_next_pull_resumes_it(c: httpx.Client, hub: FakeHub, hf_env: Path) -> None:
    path = "Tiny-Q5_K_M.gguf"
    size = len(hub.repos[TINY].files[path])
    pause = hub.pause(f"{TINY}/{path}", 500_000)
    task = c.post("/models/pull", json={"model": f"{TINY}:Q5_K_M", "include_mmproj": False}).json()
    assert pause.reached.wait(60)
    wait_for_progress(c, task["id"], 500_000)
    r = c.post(f"/tasks/{task['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    last = read_events(c, task["id"])[-1]
    assert last.event == "model.download.cancelled" and last.data["bytes_kept"] == 500_000
    assert hub.wait_idle()
    pause.release.set()
    hub.downloaded.clear()
    again = c.post("/models/pull", json={"model": f"{TINY}:Q5_K_M", "include_mmproj": False}).json()
    assert again["download"]["files"][0]["path"] == path
    evs = read_events(c, again["id"])
    assert evs[1].event == "model.download.started" and evs[1].data["bytes_done"] == 500_000
    assert evs[-1].event == "model.download.completed"
    assert hub.downloaded[f"{TINY}/{path}"] == size - 500_000


def test_two_pulls_of_one_model_share_the_download(c: httpx.Client, hub: FakeHub) -> None:
    path = "Tiny-Q5_K_M.gguf"
    pause = hub.pause(f"{TINY}/{path}", 300_000)
    first = c.post("/models/pull", json={"model": f"{TINY}:Q5_K_M", "include_mmproj": False}).json()
    assert pause.reached.wait(60)
    second = c.post("/models/pull", json={"model": f"{TINY}/{path}"}).json()
    wait_for_progress(c, second["id"], 300_000)  # the second follows the transfer the first started
    pause.release.set()
    for task in (first, second):
        assert wait_task(c, task["id"], {"completed", "failed"})["status"] == "completed"
    assert hub.downloaded[f"{TINY}/{path}"] == len(hub.repos[TINY].files[path])


def test_a_stopped_service_resumes_the_download_when_it_starts_again(
    daemon_factory, home: Path, hub: FakeHub, hf_env: Path
) -> None:
    path = "Tiny-Q5_K_M.gguf"
    size = len(hub.repos[TINY].files[path])
    pause = hub.pause(f"{TINY}/{path}", 400_000)
    vault = MemoryVault()  # the owner token survives the restart, as the keyring's does
    first = daemon_factory(default_dirs=True, vault=vault)
    with httpx.Client(base_url=first.url, timeout=60, headers=first.auth_headers) as c:
        task = c.post("/models/pull", json={"model": f"{TINY}:Q5_K_M", "include_mmproj": False}).json()
        assert pause.reached.wait(60)
        wait_for_progress(c, task["id"], 400_000)
        seen = read_events(c, task["id"], stop_after=3)
    first.stop()  # SIGTERM-like: the download pauses and goes back to the queue
    assert hub.wait_idle()
    pause.release.set()
    hub.downloaded.clear()
    second = daemon_factory(default_dirs=True, vault=vault)
    with httpx.Client(base_url=second.url, timeout=60, headers=second.auth_headers) as c:
        doc = wait_task(c, task["id"], {"completed", "failed"})
        assert doc["status"] == "completed", doc
        evs = read_events(c, task["id"], after=seen[-1].id)  # resumed from where this reader stopped
        assert [e.id for e in evs] == list(range(seen[-1].id + 1, seen[-1].id + 1 + len(evs)))
        names = [e.event for e in evs]
        paused = names.index("model.download.paused")
        assert evs[paused].data["reason"] == "service_stopped"
        restarted = evs[paused + 1]
        assert restarted.event == "model.download.started" and restarted.data["resumed"] is True
        assert restarted.data["bytes_done"] == 400_000
        assert names[-1] == "model.download.completed"
        assert "tiny-hub:1m-q5_k_m" in model_ids(c)
    assert hub.downloaded[f"{TINY}/{path}"] == size - 400_000


def test_pull_problems_are_problem_documents(c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub) -> None:
    r = c.post("/models/pull", json={"model": "not a model"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request" and r.json()["param"] == "model"
    assert c.post("/models/pull", json={"model": TINY, "include_mmproj": "yes"}).json()["param"] == "include_mmproj"
    assert c.post("/models/pull", json={}).status_code == 400
    r = c.post("/models/pull", json={"model": "test-org/Missing-GGUF"})
    assert r.status_code == 404 and r.json()["code"] == "repository_not_found"
    r = c.post("/models/pull", json={"model": f"{TINY}:IQ1_S"})
    assert r.status_code == 404 and r.json()["code"] == "file_not_found" and "Q4_K_M" in r.json()["detail"]
    r = c.post("/models/pull", json={"model": GATED})
    doc = r.json()
    assert r.status_code == 403 and doc["code"] == "gated_repository"
    assert doc["license_url"] == f"{hub.endpoint}/{GATED}" and r.headers["content-type"] == "application/problem+json"
    hub_daemon.daemon.downloads.puller.free_space = lambda _folder: 1000  # a nearly full disk (the free-space seam)
    r = c.post("/models/pull", json={"model": NOQ4})
    doc = r.json()
    assert r.status_code == 507 and doc["code"] == "insufficient_storage"
    assert (
        doc["available_bytes"] == 1000 and doc["required_bytes"] > 677_056 and "Not enough disk space" in doc["detail"]
    )
    assert c.get("/tasks").json()["data"] == []  # no task was made for any of these
    assert sum(hub.downloaded.values()) == 0


def test_pulling_needs_models_manage(hub_daemon: LiveDaemon, hub: FakeHub) -> None:
    tokens = hub_daemon.daemon.auth.tokens
    reader = tokens.create("reader", ["models:read", "tasks:read"]).secret
    r = httpx.post(f"{hub_daemon.url}/models/pull", json={"model": TINY}, headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    assert 'scope="models:manage"' in r.headers["www-authenticate"]
    assert httpx.post(f"{hub_daemon.url}/models/pull", json={"model": TINY}).status_code == 401


def test_a_failed_download_ends_the_task_failed_with_the_problem(c: httpx.Client, hub: FakeHub) -> None:
    path = "Tiny-Q4_K_M.gguf"
    hub.flip[f"{TINY}/{path}"] = 200_000
    task = c.post("/models/pull", json={"model": f"{TINY}/{path}"}).json()
    doc = wait_task(c, task["id"], {"failed", "completed"})
    assert doc["status"] == "failed" and doc["error"]["code"] == "verification_failed"
    last = read_events(c, task["id"])[-1]
    assert last.event == "model.download.failed" and "deleted" in last.data["error"]["detail"]
    assert PULLED not in model_ids(c)


def test_the_service_starts_without_loading_huggingface_hub(hub_daemon: LiveDaemon) -> None:
    """huggingface_hub loads with the first pull, so an idle service never pays for it."""
    import subprocess
    import sys

    code = "import sys, lmsp_tray.daemon, lmsp_tray.cli.main; print(sorted(m for m in ('huggingface_hub', 'httpx2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_downloads_reach_tray_listeners(c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub) -> None:
    seen: list = []
    done = threading.Event()

    def listener(status) -> None:
        seen.append(status)
        if status.state in ("completed", "failed", "cancelled"):
            done.set()

    hub_daemon.daemon.downloads.subscribe(listener)
    c.post("/models/pull", json={"model": f"{TINY}:Q4_K_M", "include_mmproj": False})
    assert done.wait(60)
    assert seen[-1].state == "completed" and seen[-1].model_id == PULLED
    assert any(s.state == "running" for s in seen)
    # Listeners hear "completed" before the run's worker is forgotten (its done callback, one loop turn later).
    wait_until(lambda: hub_daemon.daemon.downloads.active() == [], 10, "the finished download to leave the active list")
