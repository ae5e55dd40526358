"""`lmsp-tray launch`: its settings for Claude Code and Codex CLI, its token, its model and window checks.

Real parts: a live service on generated models, `launch` as its own process with the real keyring
(Secret Service on the test bus), the pairing approved over the API. `--print` shows what the agent
would get; a stand-in `claude` on PATH shows what it really gets and that its exit status is launch's.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from keyring_support import secret_service  # noqa: F401 - the fixture
from launch_support import TOKEN_NAME, launch_env, run_launch
from support import LiveDaemon, start_daemon

from lmsp_tray.connect import forget, stored_token

BIG, MID, SMALL = "agent-big:1m-f32", "agent-mid:1m-f32", "agent-small:1m-f32"
APPS = ("Claude Code", "Codex CLI", "aider")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, secret_service: str) -> Iterator[LiveDaemon]:
    """Three models: trained for 32k, 16k and 2k tokens (the window is the trained length or less)."""
    folder = tmp_path_factory.mktemp("agent-models")
    for name, trained in (("agent-big", 32768), ("agent-mid", 16384), ("agent-small", 2048)):
        write_tiny_gguf(folder / f"{name}.gguf", basename=name, context_length=trained)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(tmp_path_factory.mktemp("launch-home")))
        for app in APPS:
            forget(app)
        daemon = start_daemon(folder, context_cap=32768)
        yield daemon
        daemon.stop()
        for app in APPS:
            forget(app)


def exports(stdout: str) -> dict[str, str]:
    """The variables `--print` sets (`export NAME=value`) and unsets (value None)."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0]
        elif line.startswith("unset "):
            found[line.removeprefix("unset ")] = ""
    return found


def tokens_named(live: LiveDaemon, app: str) -> list[str]:
    return [t.id for t in live.daemon.auth.tokens.tokens() if t.name == TOKEN_NAME.format(app) and t.revoked_at is None]


def test_print_claude_pairs_once_and_reuses_the_keyring_token(live: LiveDaemon, tmp_path: Path) -> None:
    run, approved = run_launch(live, ["claude", "--model", BIG, "--print"])
    assert run.returncode == 0, run.stderr
    assert approved == ["Claude Code"]  # paired under the agent's name: shown under Apps, revocable there
    env = exports(run.stdout)
    token = stored_token("Claude Code")
    assert token and env["ANTHROPIC_AUTH_TOKEN"] == token  # the keyring's token, under the agent's name
    assert env["ANTHROPIC_BASE_URL"] == live.base
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL"):
        assert env[name] == BIG, name
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == env["ANTHROPIC_DEFAULT_OPUS_MODEL"] == BIG
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == env["DISABLE_TELEMETRY"] == "1"
    assert env["DISABLE_AUTOUPDATER"] == "1" and env["ANTHROPIC_API_KEY"] == ""  # a real key is not sent
    assert run.stdout.strip().splitlines()[-1] == "claude"
    assert len(tokens_named(live, "Claude Code")) == 1
    # the token answers on Anthropic's door, with the model chosen
    r = httpx.post(
        live.base + "/v1/messages",
        headers={"x-api-key": token, "anthropic-version": "2023-06-01"},
        json={"model": BIG, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["model"] == BIG, r.text
    # never on stderr, nor in the service's log
    assert token not in run.stderr
    logs = Path(os.environ["LMSP_TRAY_HOME"])
    assert all(token not in p.read_text(errors="replace") for p in logs.rglob("*.log*") if p.is_file())

    again, approved = run_launch(live, ["claude", "--model", BIG, "--print", "--", "-p", "hi there"])
    assert again.returncode == 0 and approved == [], again.stderr  # reused: nothing to approve
    assert exports(again.stdout)["ANTHROPIC_AUTH_TOKEN"] == token
    assert again.stdout.strip().splitlines()[-1] == "claude -p 'hi there'"
    assert len(tokens_named(live, "Claude Code")) == 1


def test_print_codex_passes_its_provider_on_the_command_line(live: LiveDaemon, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    run, approved = run_launch(
        live, ["codex", "--model", BIG, "--print", "--", "exec", "Say hi"], env=launch_env(HOME=str(home))
    )
    assert run.returncode == 0 and approved == ["Codex CLI"], run.stderr
    token = stored_token("Codex CLI")
    assert token and exports(run.stdout) == {"LMSP_TRAY_AGENT_TOKEN": token}
    argv = shlex.split(run.stdout.strip().splitlines()[-1])
    assert argv[0] == "codex" and argv[-2:] == ["exec", "Say hi"]
    options = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert 'model_provider="lmsp"' in options and f'model="{BIG}"' in options
    assert f'model_providers.lmsp.base_url="{live.base}/v1"' in options
    assert 'model_providers.lmsp.wire_api="responses"' in options
    assert 'model_providers.lmsp.env_key="LMSP_TRAY_AGENT_TOKEN"' in options
    assert list(home.iterdir()) == []  # nothing written into the person's own config
    assert token not in run.stderr


def test_launch_runs_the_agent_with_its_settings_and_exit_status(live: LiveDaemon, tmp_path: Path) -> None:
    """A stand-in `claude` on PATH: it gets the variables and the arguments, and its exit status is launch's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen.txt"
    fake = bin_dir / "claude"
    fake.write_text(
        "#!/bin/sh\n"
        f'{{ printf "%s\\n" "$@"; env | grep -E "^(ANTHROPIC|DISABLE|CLAUDE_CODE)" | sort; }} > "{seen}"\n'
        "exit 7\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = launch_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", ANTHROPIC_API_KEY="sk-ant-real")
    run, _ = run_launch(live, ["claude", "--model", BIG, "--", "-p", "two words"], env=env)
    assert run.returncode == 7, run.stderr
    lines = seen.read_text().splitlines()
    seen.unlink()  # it holds the token: no secret is left in the test's files
    assert lines[:2] == ["-p", "two words"]
    got = dict(line.split("=", 1) for line in lines[2:])
    assert got["ANTHROPIC_BASE_URL"] == live.base and got["ANTHROPIC_MODEL"] == BIG
    assert got["ANTHROPIC_AUTH_TOKEN"] == stored_token("Claude Code")
    assert "ANTHROPIC_API_KEY" not in got  # the person's Anthropic key is not sent to the local service

    missing, _ = run_launch(live, ["claude", "--model", BIG], env=launch_env(PATH="/nonexistent"))
    assert missing.returncode == 1 and "`claude` is not on PATH" in missing.stderr and "--print" in missing.stderr


def test_model_choice(live: LiveDaemon) -> None:
    run, _ = run_launch(live, ["claude", "--print"])  # three models, no terminal to ask on
    assert run.returncode == 2 and "--model" in run.stderr, run.stderr
    assert BIG in run.stderr and MID in run.stderr and "32,768-token window" in run.stderr
    chosen, _ = run_launch(live, ["claude", "--print"], env=launch_env(LMSP_TRAY_MODEL=BIG))
    assert chosen.returncode == 0 and exports(chosen.stdout)["ANTHROPIC_MODEL"] == BIG, chosen.stderr
    unknown, _ = run_launch(live, ["claude", "--print", "--model", "no-such:model"])
    assert unknown.returncode == 1 and "no model 'no-such:model'" in unknown.stderr and BIG in unknown.stderr


def test_context_window_checked(live: LiveDaemon) -> None:
    small, _ = run_launch(live, ["claude", "--print", "--model", SMALL])
    assert small.returncode == 1 and small.stdout == "", small.stderr
    assert f"{SMALL} was trained for 2,048 tokens" in small.stderr and "24,576" in small.stderr
    mid, _ = run_launch(live, ["claude", "--print", "--model", MID])  # Claude Code's first request is ~20k
    assert mid.returncode == 1 and f"{MID} was trained for 16,384 tokens" in mid.stderr
    codex, _ = run_launch(live, ["codex", "--print", "--model", MID])  # enough to start, short of a session
    assert codex.returncode == 0 and exports(codex.stdout) == {"LMSP_TRAY_AGENT_TOKEN": stored_token("Codex CLI")}
    assert "trained for 16,384 tokens" in codex.stderr and "wants 32,768" in codex.stderr
    big, _ = run_launch(live, ["claude", "--print", "--model", BIG])
    assert big.returncode == 0 and big.stderr == "", big.stderr


def test_context_window_limited_by_the_setting(tmp_path: Path, secret_service: str) -> None:
    folder = tmp_path / "models"
    write_tiny_gguf(folder / "agent-big.gguf", basename="agent-big", context_length=32768)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(tmp_path / "home"))
        forget("Claude Code")
        live = start_daemon(folder, context_cap=4096)
        try:
            run, _ = run_launch(live, ["claude", "--print"])  # the only model: chosen without asking
        finally:
            live.stop()
            forget("Claude Code")
    assert run.returncode == 1, run.stderr
    assert f"gives {BIG} a 4,096-token window" in run.stderr and "context_cap = 32768" in run.stderr


def test_unknown_agent(live: LiveDaemon) -> None:
    run, approved = run_launch(live, ["aider", "--model", BIG])
    assert run.returncode == 2 and approved == [], run.stderr  # refused before any pairing
    assert "does not know the agent 'aider'" in run.stderr and "claude, codex" in run.stderr
    assert "--print" in run.stderr
    printed, approved = run_launch(live, ["aider", "--model", BIG, "--print"])
    assert printed.returncode == 0 and approved == ["aider"], printed.stderr
    env = exports(printed.stdout)
    assert env["OPENAI_BASE_URL"] == live.base + "/v1" and env["OPENAI_API_KEY"] == stored_token("aider")
