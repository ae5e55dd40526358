"""The `lmsp-tray` command as a user runs it: real processes, real sockets, real signals."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import SSE, TINY_ID, cli_headers, free_port, iter_sse, wait_until, wait_url


def run_cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmsp_tray", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_help_and_version(env: dict[str, str]) -> None:
    out = run_cli("--help", env=env)
    assert out.returncode == 0
    for word in ("serve", "models", "autostart", "--port", "--models-dir", "--no-default-dirs"):
        assert word in out.stdout
    out = run_cli("--version", env=env)
    assert out.returncode == 0 and out.stdout.startswith("lmsp-tray ")


def test_models_lists_without_a_service(env: dict[str, str], models_dir: Path) -> None:
    (models_dir / "broken.gguf").write_bytes(b"GGUF" + b"\x00" * 10)
    out = run_cli("models", "--models-dir", str(models_dir), "--no-default-dirs", env=env)
    assert out.returncode == 0, out.stderr
    assert TINY_ID in out.stdout and "slow-test:4m-f32" in out.stdout
    assert "error:" in out.stdout  # the truncated file is listed with its problem
    out = run_cli("models", "--json", "--models-dir", str(models_dir), "--no-default-dirs", env=env)
    rows = json.loads(out.stdout)
    assert {r["id"] for r in rows} >= {TINY_ID, "slow-test:4m-f32"}
    [broken] = [r for r in rows if r["state"] == "error"]
    assert broken["error"]


def test_bad_config_is_one_clear_line(env: dict[str, str], tmp_path: Path) -> None:
    config_dir = tmp_path / "lmsp" / "config"
    config_dir.mkdir(parents=True)
    (config_dir / "config.toml").write_text("prot = 1\n")
    out = run_cli("serve", env=env)
    assert out.returncode == 2
    assert "unknown setting 'prot'" in out.stderr and "Traceback" not in out.stderr


def test_serve_single_instance_and_clean_sigterm(env: dict[str, str], models_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "lmsp_tray",
        "serve",
        "--port",
        str(port),
        "--models-dir",
        str(models_dir),
        "--no-default-dirs",
    ]
    headers = cli_headers(env)
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/lmsp/v1"
    try:
        wait_url(url, proc)
        discovery = tmp_path / "lmsp" / "run" / "service.json"
        # The file is written once the socket serves: an answer can come a moment before it.
        info = json.loads(wait_until(lambda: discovery.exists() and discovery.read_text(), 30, "service.json"))
        assert info["url"] == url and info["pid"] == proc.pid and info["version"] and info["started_at"] > 0
        assert stat.S_IMODE(discovery.stat().st_mode) == 0o600

        # A second start finds the first instead of failing on the port.
        second = run_cli("serve", "--models-dir", str(models_dir), "--no-default-dirs", env=env, timeout=60)
        assert second.returncode == 0
        assert f"already running at {url}" in second.stdout

        # An open stream gets its terminal event when the service is asked to stop.
        with httpx.Client(timeout=60, headers=headers) as c:
            c.post(f"{url}/models/slow-test:4m-f32/load").raise_for_status()
            with c.stream(
                "POST",
                f"{url}/responses",
                json={"model": "slow-test:4m-f32", "input": "x", "max_output_tokens": 4000, "stream": True},
            ) as r:
                it = iter_sse(r)
                next(e for e in it if isinstance(e, SSE) and e.event == "response.output_text.delta")
                proc.send_signal(signal.SIGTERM)
                rest = [e for e in it if isinstance(e, SSE)]
        assert rest and rest[-1].event in {"response.cancelled", "response.failed"}
        assert proc.wait(30) == 0
        assert not discovery.exists()
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()


def test_busy_port_is_a_clear_error(env: dict[str, str], models_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_cli("serve", "--port", str(port), "--models-dir", str(models_dir), "--no-default-dirs", env=env)
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.gemma
def test_demo_model_when_user_has_none(env: dict[str, str], gemma_gguf: Path) -> None:
    """No models anywhere: the demo extra's Gemma file is assembled once, with progress, and served."""
    port = free_port()
    headers = cli_headers(env, "models:read")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmsp_tray", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/lmsp/v1"
    try:
        wait_url(url, proc, timeout=120)
        models = httpx.get(f"{url}/models", timeout=30, headers=headers).json()["data"]
        assert [m["id"] for m in models] == ["gemma-3:270m-q4_k_m"]
        assert models[0]["source"] == "lmsp-tray"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "preparing the built-in demo model" in stderr and "100%" in stderr
    assert (Path(env["LMSP_TRAY_HOME"]) / "data" / "models" / "gemma-3-270m-q4_k_m.gguf").stat().st_size > 2e8
