"""`lmsp-tray pull` as a person runs it: a real subprocess, the fake Hub over HTTP, Ctrl+C as SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hub_server import FakeHub
from hub_support import GATED, GRANTED, TINY, fake_hub, hub  # noqa: F401
from support import wait_until

from lmsp_tray.hub.pull import Puller
from lmsp_tray.hub.remote import HubClient
from lmsp_tray.hub.transfer import CancelToken

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def env(tmp_path: Path, hub: FakeHub) -> dict[str, str]:
    out = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING", "LMSP_TRAY")) and k not in ("XDG_CACHE_HOME",)
    }
    out.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(tmp_path / "hf-home"),
        HOME=str(tmp_path / "home"),
        LMSP_TRAY_HOME=str(tmp_path / "lmsp"),
        PYTHONUNBUFFERED="1",
    )
    return out


def cache_of(env: dict[str, str]) -> Path:
    return Path(env["HF_HOME"]) / "hub"


def lmsp(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmsp_tray", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_pull_prints_the_plan_progress_and_the_model_id(env: dict[str, str], hub: FakeHub) -> None:
    out = lmsp("pull", f"hf.co/{TINY}", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tiny-hub:1m-q4_k_m"  # what to pass as "model" to the API
    err = out.stderr
    assert "Q4_K_M: the default when the repository has it" in err
    assert "Tiny-Q4_K_M.gguf  510.8 KB" in err and "mmproj-F16.gguf  227.6 KB  (multimodal projector)" in err
    assert "On this machine: fits in RAM" in err
    assert "[####################] 100%  738.4 KB / 738.4 KB" in err  # the last progress line
    assert "Downloaded and verified 738.4 KB" in err and "Model: tiny-hub:1m-q4_k_m" in err
    # `lmsp-tray models` (discovery, no service) now lists it.
    models = lmsp("models", env=env)
    assert "tiny-hub:1m-q4_k_m" in models.stdout and "huggingface" in models.stdout
    again = lmsp("pull", f"{TINY}:Q4_K_M", env=env)
    assert again.returncode == 0 and "already in the Hugging Face cache; nothing to download" in again.stderr


def test_pull_list_shows_variants_sizes_and_the_default(env: dict[str, str]) -> None:
    out = lmsp("pull", "--list", TINY, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{TINY} at ") and "3 GGUF variant(s)" in lines[0]
    assert any(line.split()[:2] == ["Q4_K_M", "510.8"] and line.endswith("(default)") for line in lines)
    assert any(line.split()[:5] == ["Q8_0", "1.27", "MB", "3", "parts"] for line in lines)
    assert "+ mmproj-F16.gguf (multimodal projector) comes along" in out.stdout
    assert not cache_of(env).exists() or not list(cache_of(env).rglob("blobs/*"))  # nothing downloaded


def test_ctrl_c_keeps_a_resumable_part_and_the_same_command_resumes(env: dict[str, str], hub: FakeHub) -> None:
    path = "Tiny-Q5_K_M.gguf"
    data = hub.repos[TINY].files[path]
    pause = hub.pause(f"{TINY}/{path}", 400_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmsp_tray", "pull", f"{TINY}:Q5_K_M", "--no-mmproj"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    partial = cache_of(env) / "models--test-org--Tiny-GGUF" / "blobs" / f"{hub.repos[TINY].sha256(path)}.incomplete"
    try:
        assert pause.reached.wait(60)
        # the bytes before the pause reach the file (a busy machine takes its time)
        wait_until(lambda: partial.exists() and partial.stat().st_size == 400_000, 60, "the bytes before the pause")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Stopped. 400.0 KB of 859.6 KB is kept" in stderr and "run the same command to resume" in stderr
    assert "Traceback" not in stderr and stdout == ""
    assert partial.stat().st_size == 400_000
    assert hub.wait_idle()
    pause.release.set()
    hub.downloaded.clear()
    out = lmsp("pull", f"{TINY}:Q5_K_M", "--no-mmproj", env=env)
    assert out.returncode == 0, out.stderr
    assert "400.0 KB already fetched" in out.stderr
    assert hub.downloaded[f"{TINY}/{path}"] == len(data) - 400_000
    assert out.stdout.strip() == "tiny-hub:1m-q5_k_m"


def test_a_pull_in_another_process_waits_for_the_download_in_progress(env: dict[str, str], hub: FakeHub) -> None:
    """Two programs pulling one file: the second waits on the cache lock and downloads nothing itself."""
    path = "Tiny-Q5_K_M.gguf"
    pause = hub.pause(f"{TINY}/{path}", 300_000)
    here = Puller(cache_of(env), client=HubClient(hub.endpoint))
    plan = here.plan(f"{TINY}:Q5_K_M", projector=False)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(here.run(plan, lambda _: None, CancelToken())))
    worker.start()
    assert pause.reached.wait(60)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmsp_tray", "pull", f"{TINY}:Q5_K_M", "--no-mmproj"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # the other process is now waiting on the lock
    assert proc.poll() is None
    pause.release.set()
    stdout, stderr = proc.communicate(timeout=120)
    worker.join(60)
    assert proc.returncode == 0, stderr
    assert stdout.strip() == "tiny-hub:1m-q5_k_m"
    assert hub.downloaded[f"{TINY}/{path}"] == len(hub.repos[TINY].files[path])  # fetched once, by us
    assert result and result[0].model_path.exists()


def test_a_gated_model_without_login_explains_itself(env: dict[str, str], hub: FakeHub) -> None:
    out = lmsp("pull", GATED, env=env)
    assert out.returncode == 1
    assert f"open {hub.endpoint}/{GATED}, accept its licence" in out.stderr and "hf auth login" in out.stderr
    assert "Traceback" not in out.stderr
    bad = lmsp("pull", "not a model", env=env)
    assert bad.returncode == 1 and "not a Hugging Face model name" in bad.stderr


def test_the_login_hf_auth_keeps_opens_a_gated_model(env: dict[str, str], hub: FakeHub, tmp_path: Path) -> None:
    """The token file `hf auth login` writes ($HF_HOME/token) is what a pull uses; it goes nowhere else."""
    token_file = Path(env["HF_HOME"]) / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(GRANTED)
    out = lmsp("pull", GATED, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tiny-hub:1m-q4_k_m"
    assert f"Bearer {GRANTED}" in hub.hub_auth and hub.cdn_auth == []
    assert GRANTED not in out.stdout + out.stderr
    logs = Path(env["LMSP_TRAY_HOME"]) / "cache" / "logs"
    for log in logs.glob("*.log*") if logs.exists() else ():
        assert GRANTED not in log.read_text()


def test_pull_while_the_service_runs_is_the_services_download(
    env: dict[str, str], hub: FakeHub, tmp_path: Path
) -> None:
    """With the service up, `lmsp-tray pull` starts the download there (a task the tray and console show)
    and follows it; the model is then served without a rescan, and Ctrl+C cancels the service's task."""
    import httpx
    from support import free_port

    port = free_port()
    (tmp_path / "models").mkdir()
    serve = subprocess.Popen(
        [sys.executable, "-m", "lmsp_tray", "serve", "--port", str(port), "--models-dir", str(tmp_path / "models")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/lmsp/v1"
    try:
        wait_until(lambda: httpx.get(url, timeout=1).status_code == 200, 60, "the service", ignoring=httpx.HTTPError)
        out = lmsp("pull", f"hf.co/{TINY}", "--no-mmproj", env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "tiny-hub:1m-q4_k_m"
        assert "The running lmsp-tray downloads it (task task_" in out.stderr
        assert "Tiny-Q4_K_M.gguf  510.8 KB" in out.stderr and "On this machine: fits in RAM" in out.stderr
        assert "[####################] 100%" in out.stderr and "Model: tiny-hub:1m-q4_k_m" in out.stderr
        task_id = out.stderr.split("(task ", 1)[1].split(")", 1)[0]
        from lmsp_tray.cli.service import credentials
        from lmsp_tray.config import resolve_paths

        headers = {"Authorization": f"Bearer {credentials(resolve_paths(env), None)}"}  # as the CLI finds it
        with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
            task = c.get(f"/tasks/{task_id}").json()
            assert task["status"] == "completed" and task["download"]["model"] == f"hf.co/{TINY}:Q4_K_M"
            assert "tiny-hub:1m-q4_k_m" in {m["id"] for m in c.get("/models").json()["data"]}

        # Ctrl+C: the service's task is cancelled, the part is kept.
        pause = hub.pause(f"{TINY}/Tiny-Q5_K_M.gguf", 300_000)
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmsp_tray", "pull", f"{TINY}:Q5_K_M", "--no-mmproj"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        assert pause.reached.wait(60)
        # The service reaching the pause says nothing of the command: Ctrl+C once it follows the task (its
        # plan is printed from the task's first event), not while it still waits for the POST's answer.
        wait_until(lambda: any("On this machine" in line for line in said), 60, "the command to follow the task")
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        reader.join(60)
        proc.stdout.close()
        proc.stderr.close()
        stderr = "".join(said)
        pause.release.set()
        assert proc.returncode == 130, stderr
        assert "Stopped. What was fetched is kept" in stderr and "Traceback" not in stderr
        cancelled = stderr.split("(task ", 1)[1].split(")", 1)[0]
        with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
            assert c.get(f"/tasks/{cancelled}").json()["status"] == "cancelled"
    finally:
        serve.terminate()
        serve.communicate(timeout=60)  # waits, and closes its pipes
