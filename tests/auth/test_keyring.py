"""Token secrets in the real OS keyring (gnome-keyring's Secret Service on a private D-Bus), and its failures.

Run by `.ci/run` inside `dbus-run-session`; run by hand, the fixture starts
its own bus and keyring. Every failure mode — no backend, no D-Bus, a
locked keyring — must end in a clear sentence, never a traceback, and never
a secret written to a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from keyring_support import (
    real_vault,
    secret_service,  # noqa: F401 - fixture
    secret_tool,
    start_keyring_daemon,
    start_private_keyring,
    tools_missing,
)
from support import ROOT, LiveDaemon, start_daemon, wait_until

from lmsp_tray.auth.tokens import OWNER_NAME, hash_secret
from lmsp_tray.auth.vault import KeyringUnavailable, SecretVault


def run_cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmsp_tray", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def cli_env(lmsp_home: Path, secret_service: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "LMSP_TRAY_TOKEN")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture
def keyring_daemon(lmsp_home: Path, models_dir: Path, secret_service: str) -> Iterator[LiveDaemon]:
    live = start_daemon(models_dir, vault=real_vault())
    yield live
    live.stop()


def test_vault_round_trip(secret_service: str) -> None:
    vault = real_vault()
    assert "SecretService" in vault.backend_name() or "Secret" in vault.backend_name()
    vault.store("tok_test_round_trip", "lmsp_round-trip-secret")
    assert vault.load("tok_test_round_trip") == "lmsp_round-trip-secret"
    seen = secret_tool("lookup", "service", "lmsp-tray", "username", "tok_test_round_trip")
    assert seen.stdout.strip() == "lmsp_round-trip-secret"
    assert vault.delete("tok_test_round_trip") is True
    assert vault.load("tok_test_round_trip") is None
    assert vault.delete("tok_test_round_trip") is False


def test_owner_token_lives_in_the_keyring_across_restarts(
    lmsp_home: Path, models_dir: Path, secret_service: str
) -> None:
    first = start_daemon(models_dir, vault=real_vault())
    try:
        tokens = first.daemon.auth.tokens
        owner_id, owner = tokens.owner_id, first.owner_token
        assert not tokens.owner_ephemeral and tokens.keyring_problem is None
        assert secret_tool("lookup", "service", "lmsp-tray", "username", owner_id).stdout.strip() == owner
        record = tokens.get(owner_id)
        assert record.name == OWNER_NAME and record.secret_hash == hash_secret(owner)
        assert httpx.get(first.url + "/auth/tokens", headers=first.auth_headers, timeout=30).status_code == 200
    finally:
        first.stop()
    second = start_daemon(models_dir, vault=real_vault())
    try:
        assert second.daemon.auth.tokens.owner_id == owner_id and second.owner_token == owner
    finally:
        second.stop()
    # The keyring entry is gone (the user cleared it): a new owner replaces the old, which is revoked.
    assert secret_tool("clear", "service", "lmsp-tray", "username", owner_id).returncode == 0
    third = start_daemon(models_dir, vault=real_vault())
    try:
        tokens = third.daemon.auth.tokens
        assert tokens.owner_id != owner_id and tokens.get(owner_id).revoked_at is not None
        assert (
            httpx.get(third.url + "/models", headers={"Authorization": f"Bearer {owner}"}, timeout=30).status_code
            == 401
        )
    finally:
        third.stop()


def test_cli_against_the_running_service(keyring_daemon: LiveDaemon, cli_env: dict[str, str]) -> None:
    live = keyring_daemon
    # TOKEN=$(lmsp-tray tokens create …): only the secret reaches stdout.
    shell = subprocess.run(
        [
            "sh",
            "-c",
            (
                f'TOKEN=$("{sys.executable}" -m lmsp_tray tokens create --name shell --scope models:read) '
                '&& printf "%s" "$TOKEN"'
            ),
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shell.returncode == 0, shell.stderr
    secret = shell.stdout
    assert secret.startswith("lmsp_") and len(secret) >= 5 + 43 and "\n" not in secret
    assert "created tok_" in shell.stderr and secret not in shell.stderr
    assert httpx.get(live.url + "/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30).status_code == 200
    [made] = [r for r in live.daemon.auth.tokens.tokens() if r.name == "shell"]
    assert secret_tool("lookup", "service", "lmsp-tray", "username", made.id).stdout.strip() == secret

    listing = run_cli("tokens", "list", env=cli_env)
    assert listing.returncode == 0 and made.id in listing.stdout and "shell" in listing.stdout
    assert secret not in listing.stdout + listing.stderr and live.owner_token not in listing.stdout
    as_json = run_cli("tokens", "list", "--json", env=cli_env)
    assert secret not in as_json.stdout and made.secret_hash not in as_json.stdout

    revoked = run_cli("tokens", "revoke", made.id, env=cli_env)
    assert revoked.returncode == 0, revoked.stderr
    assert httpx.get(live.url + "/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30).status_code == 401
    assert secret_tool("lookup", "service", "lmsp-tray", "username", made.id).stdout == ""

    bad = run_cli("tokens", "create", "--name", "x", "--scope", "tools:execute", env=cli_env)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr
    missing = run_cli("tokens", "revoke", "tok_nope", env=cli_env)
    assert missing.returncode == 1 and "no token" in missing.stderr.lower() and "Traceback" not in missing.stderr


def test_cli_on_the_data_folder_when_no_service_runs(
    lmsp_home: Path, models_dir: Path, cli_env: dict[str, str]
) -> None:
    made = run_cli(
        "tokens", "create", "--name", "offline", "--scope", "models:read", "--scope", "tasks:read", env=cli_env
    )
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert "warning" not in made.stderr  # the keyring took it
    listing = run_cli("tokens", "list", "--json", env=cli_env)
    [row] = [t for t in __import__("json").loads(listing.stdout) if t["name"] == "offline"]
    assert row["scopes"] == ["models:read", "tasks:read"] and secret not in listing.stdout
    assert real_vault().load(row["id"]) == secret
    live = start_daemon(models_dir, vault=real_vault())  # the service picks the token up from the database
    try:
        auth = {"Authorization": f"Bearer {secret}"}
        assert httpx.get(live.url + "/models", headers=auth, timeout=30).status_code == 200
    finally:
        live.stop()
    assert run_cli("tokens", "revoke", row["id"], env=cli_env).returncode == 0
    approve = run_cli("tokens", "approve", "BCDF-GHJK", env=cli_env)
    assert approve.returncode == 1 and "not running" in approve.stderr


# -- failures --------------------------------------------------------------------------------------
def _no_traceback(out: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout


def test_no_backend(lmsp_home: Path, models_dir: Path, cli_env: dict[str, str]) -> None:
    import keyring.backends.fail
    import keyring.backends.null

    with pytest.raises(KeyringUnavailable) as info:
        SecretVault(keyring.backends.fail.Keyring()).store("tok_x", "lmsp_x")
    assert info.value.kind == "no_backend" and "no keyring backend" in str(info.value)
    with pytest.raises(KeyringUnavailable) as info:  # the null backend would silently drop secrets
        SecretVault(keyring.backends.null.Keyring()).store("tok_x", "lmsp_x")
    assert info.value.kind == "unsafe_backend"

    env = {**cli_env, "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    made = run_cli("tokens", "create", "--name", "nokeyring", "--scope", "models:read", env=env)
    _no_traceback(made)
    assert made.returncode == 0 and made.stdout.strip().startswith("lmsp_")
    assert "keyring could not keep a copy" in made.stderr and "no keyring backend" in made.stderr

    # A service started without a keyring works with a session owner token, which it hands the CLI
    # in a file only this user can read (tests/auth/test_tokens_no_keyring.py runs it as real processes).
    live = start_daemon(models_dir, vault=SecretVault(keyring.backends.fail.Keyring()))
    try:
        tokens = live.daemon.auth.tokens
        assert tokens.owner_ephemeral and "no keyring backend" in (tokens.keyring_problem or "")
        assert httpx.get(live.url + "/auth/tokens", headers=live.auth_headers, timeout=30).status_code == 200
        assert all(r.id != tokens.owner_id for r in tokens.tokens())  # the session owner is in no database
        out = run_cli("tokens", "list", env=env)
        _no_traceback(out)
        assert out.returncode == 0 and "nokeyring" in out.stdout
        out = run_cli("tokens", "list", env={**env, "LMSP_TRAY_TOKEN": made.stdout.strip()})
        assert out.returncode == 1 and "tokens:manage" in out.stderr  # refused: that token lacks the scope
        _no_traceback(out)
        out = run_cli("tokens", "list", env={**env, "LMSP_TRAY_TOKEN": live.owner_token})
        assert out.returncode == 0 and "nokeyring" in out.stdout
    finally:
        live.stop()


def test_no_dbus(lmsp_home: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring.backends.SecretService

    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS")
    with pytest.raises(KeyringUnavailable) as info:
        SecretVault(keyring.backends.SecretService.Keyring()).store("tok_x", "lmsp_x")
    assert info.value.kind == "no_dbus" and "D-Bus" in str(info.value)
    env = {k: v for k, v in cli_env.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    made = run_cli("tokens", "create", "--name", "nobus", "--scope", "models:read", env=env)
    _no_traceback(made)
    assert made.returncode == 0 and "D-Bus" in made.stderr


@pytest.fixture
def locked_keyring(monkeypatch: pytest.MonkeyPatch, secret_service: str) -> Iterator[str]:
    """A fresh keyring of its own, locked (it cannot be unlocked without a prompt, so it is not shared)."""
    if tools_missing():
        pytest.skip(tools_missing())
    own = start_private_keyring()
    try:
        monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", own.address)
        real_vault().store("tok_before_lock", "lmsp_before")
        import secretstorage

        conn = secretstorage.dbus_init()
        try:
            secretstorage.get_default_collection(conn).lock()
        finally:
            conn.close()
        yield own.address
    finally:
        own.stop()


def test_locked_keyring(locked_keyring: str, lmsp_home: Path, models_dir: Path, cli_env: dict[str, str]) -> None:
    with pytest.raises(KeyringUnavailable) as info:
        real_vault().load("tok_before_lock")
    assert info.value.kind == "locked" and "locked" in str(info.value)
    live = start_daemon(models_dir, vault=real_vault())
    try:
        tokens = live.daemon.auth.tokens
        assert tokens.owner_ephemeral and "locked" in (tokens.keyring_problem or "")
        assert httpx.get(live.url + "/models", headers=live.auth_headers, timeout=30).status_code == 200
        out = run_cli("tokens", "list", env={**cli_env, "DBUS_SESSION_BUS_ADDRESS": locked_keyring})
        _no_traceback(out)
        assert out.returncode == 0 and "lmsp-tray owner" not in out.stdout  # via the run's owner token file
    finally:
        live.stop()
    made = run_cli(
        "tokens",
        "create",
        "--name",
        "locked",
        "--scope",
        "models:read",
        env={**cli_env, "DBUS_SESSION_BUS_ADDRESS": locked_keyring},
    )
    _no_traceback(made)
    assert made.returncode == 0 and "locked" in made.stderr and made.stdout.startswith("lmsp_")


def test_no_secret_file_is_written_without_a_keyring(lmsp_home: Path, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    made = run_cli("tokens", "create", "--name", "nofile", "--scope", "models:read", env=env)
    secret = made.stdout.strip().encode()
    assert secret.startswith(b"lmsp_")
    for path in lmsp_home.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path


def _labels(address: str) -> dict[str, str]:
    """username (token id) -> label of lmsp-tray's entries, read with secretstorage (libsecret's view)."""
    import secretstorage
    from jeepney.io.blocking import open_dbus_connection

    conn = open_dbus_connection(address)
    try:
        items = secretstorage.get_default_collection(conn).search_items({"service": "lmsp-tray"})
        return {item.get_attributes()["username"]: item.get_label() for item in items}
    finally:
        conn.close()


def test_keyring_entries_carry_the_tokens_name(keyring_daemon: LiveDaemon, secret_service: str) -> None:
    tokens = keyring_daemon.daemon.auth.tokens
    issued = tokens.create("my-app", ["models:read"])
    labels = _labels(secret_service)
    assert labels[issued.record.id] == "lmsp-tray token: my-app"
    assert labels[tokens.owner_id] == "lmsp-tray token: lmsp-tray owner"
    assert real_vault().load(issued.record.id) == issued.secret  # read back by its attributes as before


def test_the_keyring_recovers_by_itself(lmsp_home: Path, models_dir: Path) -> None:
    """A session whose keyring starts after lmsp-tray (or is unlocked later): it notices, moves the
    owner token into the keyring, drops the owner token file, and says so to its listeners."""
    if tools_missing():
        pytest.skip(tools_missing())
    own = start_private_keyring(daemon=False)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DBUS_SESSION_BUS_ADDRESS", own.address)
            mp.delenv("DISPLAY", raising=False)
            live = start_daemon(models_dir, vault=real_vault(), keyring_retry=0.2)
            try:
                tokens = live.daemon.auth.tokens
                heard: list[object] = []
                tokens.add_keyring_listener(heard.append)
                assert tokens.owner_ephemeral and tokens.keyring_error is not None
                token_file = live.daemon.owner_token_file
                assert token_file.read_text().strip() == tokens.owner_secret
                session_secret = tokens.owner_secret
                discovery = json.loads(live.daemon.paths.discovery_file.read_text())
                assert "owner_token_id" not in discovery

                start_keyring_daemon(own)  # the keyring comes up
                # The listeners are told on the retry thread just after the state changes: wait for the word.
                wait_until(lambda: heard, 30, "the keyring to be used again", interval=0.05)
                assert tokens.keyring_error is None and not tokens.owner_ephemeral and heard == [None]
                assert real_vault().load(tokens.owner_id) == tokens.owner_secret
                assert _labels(own.address)[tokens.owner_id] == "lmsp-tray token: lmsp-tray owner"
                wait_until(lambda: not token_file.exists(), 10, "the owner token file to be removed", interval=0.05)
                assert json.loads(live.daemon.paths.discovery_file.read_text())["owner_token_id"] == tokens.owner_id
                for secret in (session_secret, tokens.owner_secret):  # the run's first token still works
                    reply = httpx.get(live.url + "/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
                    assert reply.status_code == 200
            finally:
                live.stop()
    finally:
        own.stop()
