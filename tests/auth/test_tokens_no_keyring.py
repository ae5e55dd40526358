"""No keyring at all (a headless box, a container, WSL): a token is obtainable while the service runs.

Real processes, as a person runs them in two terminals: the service started in one, `lmsp-tray
tokens create` in another whose `XDG_RUNTIME_DIR` differs (so the discovery file is not where the
CLI would look). The CLI finds the service through the per-home lock, authenticates with the
owner token file the service wrote for this run (0600 in its runtime folder), and the token it
prints works over HTTP at once. A service that does not answer gets no token made behind its
back.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
from desktop_support import ROOT, program
from support import TINY_ID, wait_until


def xdg_env(tmp_path: Path, runtime: str) -> dict[str, str]:
    """platformdirs' folders (no LMSP_TRAY_HOME), with this terminal's own runtime folder."""
    home = tmp_path / "home"
    (tmp_path / runtime).mkdir(mode=0o700, exist_ok=True)
    drop = ("DISPLAY", "WAYLAND_DISPLAY", "LMSP_TRAY_HOME", "LMSP_TRAY_TOKEN", "DBUS_SESSION_BUS_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("XDG_")}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_RUNTIME_DIR=str(tmp_path / runtime),
        HF_HOME=str(home / "hf"),
        OLLAMA_MODELS=str(home / "ollama"),
        PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring",  # no keyring at all
        DBUS_SESSION_BUS_ADDRESS="disabled:",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


def tokens(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*program(), "tokens", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def service(tmp_path, models_dir):
    env = xdg_env(tmp_path, "run-service")
    out = tmp_path / "service.out"
    with out.open("w") as fh:
        proc = subprocess.Popen(
            [*program(), "serve", "--port", "0", "--models-dir", str(models_dir), "--no-default-dirs"],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    discovery = tmp_path / "run-service" / "lmsp-tray" / "service.json"

    def written() -> bool:
        assert proc.poll() is None, out.read_text()
        return discovery.exists()

    wait_until(written, 60, lambda: f"the discovery file; the service said: {out.read_text()}", interval=0.05)
    url = json.loads(discovery.read_text())["url"]
    yield proc, url, tmp_path / "run-service" / "lmsp-tray"
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "Traceback" not in out.read_text()


def test_token_made_while_the_service_runs_works_at_once(tmp_path, service):
    proc, url, runtime = service
    token_file = runtime / "owner-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert not json.loads((runtime / "service.json").read_text()).get("owner_token_id")  # no keyring entry to name

    other_terminal = xdg_env(tmp_path, "run-other")  # a different XDG_RUNTIME_DIR: no discovery file there
    made = tokens(other_terminal, "create", "--name", "my-app", "--scope", "models:read")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("lmsp_") and "\n" not in secret
    assert "it works now" in made.stderr and "keyring could not keep a copy" in made.stderr
    reply = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert reply.status_code == 200 and TINY_ID in [m["id"] for m in reply.json()["data"]]

    listed = tokens(other_terminal, "list", "--json")
    assert listed.returncode == 0 and "my-app" in [t["name"] for t in json.loads(listed.stdout)]

    # Stopped (it answers nothing): the CLI says so and makes nothing it would not know.
    proc.send_signal(signal.SIGSTOP)
    refused = tokens(other_terminal, "create", "--name", "ghost", "--scope", "models:read")
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"runs for this data folder (pid {proc.pid}) but does not answer at {url}" in refused.stderr
    proc.send_signal(signal.SIGCONT)
    names = [t["name"] for t in json.loads(tokens(other_terminal, "list", "--json").stdout)]
    assert "ghost" not in names

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not token_file.exists()  # the secret of the run goes with it


def test_a_token_file_others_can_read_is_not_used(tmp_path, service):
    _, _, runtime = service
    token_file = runtime / "owner-token"
    token_file.chmod(0o644)
    try:
        out = tokens(xdg_env(tmp_path, "run-other"), "list")
        assert out.returncode == 1 and "readable by others or not yours; not using it" in out.stderr
    finally:
        token_file.chmod(0o600)
