"""A download survives the service being killed: `lmsp-tray serve` is SIGKILLed mid-file and started again.

The next start puts the download back in the queue (a ``model.download.paused``
event, reason ``service_restarted``), resumes it from the part on disk — the
fake Hub counts that only the rest is fetched — and the model is listed when
the task completes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hub_server import FakeHub
from hub_support import TINY, fake_hub, hub  # noqa: F401
from support import ROOT, SSE, cli_token, free_port, iter_sse, wait_task, wait_until

pytestmark = pytest.mark.timeout(300)


class Service:
    """`python -m lmsp_tray serve` on a fixed port, home and Hugging Face cache; killed at will."""

    def __init__(self, tmp_path: Path, hub: FakeHub) -> None:
        home = tmp_path / "lmsp"
        (home / "config").mkdir(parents=True)
        (home / "config" / "config.toml").write_text("demo_model = false\n")
        user = tmp_path / "user"
        user.mkdir()
        self.cache = user / "hf" / "hub"
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "XDG_", "LMSP_TRAY"))}
        self.env = {
            **{k: v for k, v in keep.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY"}},
            "LMSP_TRAY_HOME": str(home),
            "HOME": str(user),
            "HF_HOME": str(user / "hf"),
            "HF_ENDPOINT": hub.endpoint,
            "OLLAMA_MODELS": str(user / "ollama"),
        }
        scopes = ("models:read", "models:manage", "tasks:read", "tasks:create")
        self.headers = {
            "Authorization": f"Bearer {cli_token([sys.executable, '-m', 'lmsp_tray'], self.env, *scopes, cwd=ROOT)}"
        }
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/lmsp/v1"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmsp_tray", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        proc = self.proc

        def answered() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the service exited: {proc.stderr.read().decode()[-3000:]}")
            return httpx.get(self.url, timeout=1).status_code == 200

        wait_until(answered, 90, "the service to answer", interval=0.05, ignoring=httpx.HTTPError)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc.stderr.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.communicate(timeout=60)


def test_a_killed_service_resumes_the_download_at_the_next_start(tmp_path: Path, hub: FakeHub) -> None:
    path = "Tiny-Q5_K_M.gguf"
    size = len(hub.repos[TINY].files[path])
    pause = hub.pause(f"{TINY}/{path}", 500_000)
    service = Service(tmp_path, hub)
    service.start()
    try:
        with httpx.Client(base_url=service.url, timeout=60, headers=service.headers) as c:
            r = c.post("/models/pull", json={"model": f"hf.co/{TINY}:Q5_K_M", "include_mmproj": False})
            assert r.status_code == 202, r.text
            task_id = r.json()["id"]
            assert pause.reached.wait(60)
            wait_task(c, task_id, {"in_progress"})
        # The CDN has sent its bytes; on a busy machine the service may not have written them yet.
        partial = service.cache / "models--test-org--Tiny-GGUF" / "blobs" / f"{hub.repos[TINY].sha256(path)}.incomplete"
        wait_until(lambda: partial.exists() and partial.stat().st_size == 500_000, 60, "the bytes before the pause")
        service.kill()
        assert hub.wait_idle()
        kept = partial.stat().st_size
        assert 0 < kept <= 500_000
        pause.release.set()
        hub.downloaded.clear()
        service.start()
        with httpx.Client(base_url=service.url, timeout=60, headers=service.headers) as c:
            doc = wait_task(c, task_id, {"completed", "failed", "cancelled"})
            assert doc["status"] == "completed", doc
            with c.stream("GET", f"/tasks/{task_id}/events") as stream:
                evs = [e for e in iter_sse(stream) if isinstance(e, SSE)]
            assert [e.id for e in evs] == list(range(1, len(evs) + 1))
            names = [e.event for e in evs]
            paused = names.index("model.download.paused")
            assert evs[paused].data["reason"] == "service_restarted"
            assert names[paused + 1] == "model.download.started" and evs[paused + 1].data == {
                **evs[paused + 1].data,
                "resumed": True,
                "bytes_done": kept,
            }
            assert names[-1] == "model.download.completed" and names.count("model.download.completed") == 1
            assert evs[-1].data["model"]["id"] == "tiny-hub:1m-q5_k_m"
            assert "tiny-hub:1m-q5_k_m" in {m["id"] for m in c.get("/models").json()["data"]}
        assert hub.downloaded[f"{TINY}/{path}"] == size - kept  # no byte fetched twice
    finally:
        service.stop()
