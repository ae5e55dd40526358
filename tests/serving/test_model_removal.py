"""`DELETE /lmsp/v1/models/{id}`: only what the service owns (its models folder; what it downloaded into
the Hugging Face cache, removed as huggingface_hub removes a revision, the cache consistent by its own
scan afterwards); another app's or the person's own files refused, saying whose and where; a loaded
model unloaded first; 409 while generating unless forced."""

from __future__ import annotations

import shutil
import threading
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
from support import SLOW_ID, SSE, TINY_ID, LiveDaemon, body, iter_sse, wait_task

pytestmark = pytest.mark.timeout(300)

PULLED = "tiny-hub:1m-q4_k_m"


def listed(c: httpx.Client) -> dict[str, dict]:
    return {m["id"]: m for m in c.get("/models").json()["data"]}


def test_a_pulled_model_is_unloaded_and_its_revision_removed_as_huggingface_hub_does(
    c: httpx.Client, hub_daemon: LiveDaemon, hf_env: Path
) -> None:
    from huggingface_hub import scan_cache_dir

    task = c.post("/models/pull", json={"model": f"hf.co/{TINY}"}).json()
    assert wait_task(c, task["id"], {"completed"})["status"] == "completed"
    models = listed(c)
    assert models[PULLED]["extensions"]["lmsp_tray"]["deletable"] is True
    listing = c.get("/models").json()
    assert listing["extensions"]["lmsp_tray"]["disk_bytes"] >= models[PULLED]["size_bytes"]
    before = scan_cache_dir(hf_env)
    assert [r.repo_id for r in before.repos] == [TINY] and not before.warnings
    c.post(f"/models/{PULLED}/load").raise_for_status()
    gone = c.delete(f"/models/{PULLED}")
    assert gone.status_code == 200, gone.text
    doc = gone.json()
    assert doc["deleted"] is True and doc["freed_bytes"] == before.size_on_disk
    assert sorted(Path(f).name for f in doc["files"]) == ["Tiny-Q4_K_M.gguf", "mmproj-F16.gguf"]
    assert hub_daemon.daemon.models.get(PULLED) is None  # unloaded first
    after = scan_cache_dir(hf_env)
    assert after.repos == frozenset() and after.warnings == [] and after.size_on_disk == 0
    assert PULLED not in listed(c)
    assert c.get(f"/models/{PULLED}").status_code == 404
    assert hub_daemon.daemon.ledger.revisions() == []


def test_another_tools_download_in_the_cache_is_refused(
    c: httpx.Client, hub_daemon: LiveDaemon, hf_env: Path, hub: FakeHub
) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir

    # the person's own `hf download` (the endpoint named: huggingface_hub reads HF_ENDPOINT once, at import)
    path = Path(hf_hub_download(NOQ4, "NoQ4-Q8_0.gguf", cache_dir=hf_env, endpoint=hub.endpoint))
    hub_daemon.daemon.watcher.rescan()  # what the folder watcher does on the new files
    model = next(m for m in listed(c).values() if m["source"] == "huggingface")
    assert model["extensions"]["lmsp_tray"]["deletable"] is False
    refused = c.delete(f"/models/{model['id']}")
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "was not downloaded by lmsp-tray" in detail and NOQ4 in detail and str(hf_env) in detail
    assert path.exists() and [r.repo_id for r in scan_cache_dir(hf_env).repos] == [NOQ4]


def test_a_file_in_another_folder_is_refused_saying_whose_and_where(c: httpx.Client, models_dir: Path) -> None:
    refused = c.delete(f"/models/{TINY_ID}")
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "your own models folder" in detail and str(models_dir) in detail and "never deletes it" in detail
    assert (models_dir / "tiny-test-1m-f32.gguf").exists()


def test_own_folder_model_generating_is_409_unless_forced(daemon_factory, home: Path, slow_gguf: Path) -> None:
    live: LiveDaemon = daemon_factory(parallel=1, default_dirs=True)  # the service's own folder is scanned
    own = live.daemon.paths.models_dir / "slow-test-4m-f32.gguf"
    shutil.copyfile(slow_gguf, own)
    live.daemon.watcher.rescan()
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        model = next(m for m in listed(c).values() if m["source"] == "lmsp-tray")
        assert model["extensions"]["lmsp_tray"]["deletable"] is True
        model_id = model["id"]
        c.post(f"/models/{model_id}/load").raise_for_status()
        started = threading.Event()
        ended: list[str] = []

        def generate() -> None:
            with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as g:
                payload = body(model=model_id, max_output_tokens=4000, stream=True)
                with g.stream("POST", "/responses", json=payload) as r:
                    for e in iter_sse(r):
                        if isinstance(e, SSE):
                            if e.event == "response.output_text.delta":
                                started.set()
                            ended.append(e.event)

        worker = threading.Thread(target=generate)
        worker.start()
        try:
            assert started.wait(60)
            busy = c.delete(f"/models/{model_id}")
            assert busy.status_code == 409 and "is generating" in busy.json()["detail"]
            assert own.exists()
            forced = c.delete(f"/models/{model_id}", params={"force": "true"})
            assert forced.status_code == 200, forced.text
        finally:
            worker.join(60)
        assert not own.exists() and ended and ended[-1] != "response.output_text.delta"
        assert model_id == SLOW_ID and listed(c)[SLOW_ID]["source"] == "custom"  # the copy elsewhere is untouched


def test_cli_rm_through_the_service(c: httpx.Client, hub_daemon: LiveDaemon, hf_env: Path, lmsp_home: Path) -> None:
    import os
    import subprocess
    import sys

    task = c.post("/models/pull", json={"model": f"hf.co/{TINY}"}).json()
    assert wait_task(c, task["id"], {"completed"})["status"] == "completed"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_TRAY")}
    env.update(LMSP_TRAY_HOME=str(lmsp_home), LMSP_TRAY_TOKEN=hub_daemon.owner_token)

    def cli(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "lmsp_tray", "models", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    refused = cli("rm", TINY_ID)
    assert refused.returncode == 1 and "never deletes it" in refused.stderr
    done = cli("rm", PULLED)
    assert done.returncode == 0, done.stderr
    assert "Deleted tiny-hub:1m-q4_k_m" in done.stdout and "Tiny-Q4_K_M.gguf" in done.stdout
    assert PULLED not in listed(c)
