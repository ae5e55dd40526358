"""The connect helper end to end: a real service, the real keyring (Secret Service), approval through the CLI.

First run: no token in the keyring, so it pairs; the code it shows is approved
with `lmsp-tray tokens approve CODE` (a separate process, as a person would);
the token lands in the keyring under the app's own name. Second run: reused,
nothing to approve. After the token is revoked: it pairs again and keeps the
new one. Without a service: a clear `ServiceNotFound`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from keyring_support import real_vault, secret_service, secret_tool  # noqa: F401 - the fixture
from support import ROOT, LiveDaemon, free_port, start_daemon

from lmsp_tray import connect as connect_module
from lmsp_tray.connect import KEYRING_USER, PairingRefused, PairingRequest, ServiceNotFound, connect, forget

APP = "Connect Test Notes"


@pytest.fixture(params=[[], ["models:read", "responses:create"]], ids=["tokens-only", "keyless-on"])
def keyring_service(
    lmsp_home: Path,
    models_dir: Path,
    secret_service: str,
    request: pytest.FixtureRequest,
) -> Iterator[LiveDaemon]:
    """A service whose CLI finds the owner token in the keyring; also with `keyless_scopes` on, where a
    revoked token still reaches the keyless endpoints and must not pass for a valid one."""
    daemon = start_daemon(models_dir, vault=real_vault(), keyless_scopes=request.param)
    forget(APP)
    yield daemon
    forget(APP)
    daemon.stop()


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "LMSP_TRAY_TOKEN")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "lmsp_tray", *args], env=env, capture_output=True, text=True, timeout=120
    )


def approve_with_cli(shown: list[PairingRequest]):
    def on_code(pairing: PairingRequest) -> None:
        shown.append(pairing)
        done = cli("tokens", "approve", pairing.user_code)
        assert done.returncode == 0, done.stderr

    return on_code


def never(pairing: PairingRequest) -> None:
    raise AssertionError(f"asked to pair again: {pairing}")


def test_pair_store_reuse_and_repair_after_revoke(keyring_service: LiveDaemon) -> None:
    shown: list[PairingRequest] = []
    first = connect(APP, ["models:read", "responses:create"], on_code=approve_with_cli(shown), poll_interval=0.2)
    assert first.paired and first.stored and first.url == keyring_service.base
    assert [p.app_name for p in shown] == [APP] and shown[0].scopes == ("models:read", "responses:create")
    assert shown[0].user_code in shown[0].instructions()
    # in the keyring under the app's own name, seen by libsecret's own tool
    found = secret_tool("lookup", "service", APP, "username", KEYRING_USER)
    assert found.returncode == 0 and found.stdout.strip() == first.token
    # the token works on both APIs, with the scopes asked for
    r = httpx.get(first.openai_base_url + "/models", headers=first.headers, timeout=30)
    assert r.status_code == 200
    assert httpx.get(first.lmsp_url + "/auth/tokens", headers=first.headers, timeout=30).status_code == 403
    [record] = [t for t in keyring_service.daemon.auth.tokens.tokens() if t.name == f"{APP} (paired)"]
    assert record.scopes == ("models:read", "responses:create")

    second = connect(APP, on_code=never)
    assert not second.paired and second.token == first.token

    revoked = cli("tokens", "revoke", record.id)
    assert revoked.returncode == 0, revoked.stderr
    shown.clear()
    third = connect(APP, on_code=approve_with_cli(shown), poll_interval=0.2)
    assert third.paired and third.token != first.token and len(shown) == 1
    assert secret_tool("lookup", "service", APP, "username", KEYRING_USER).stdout.strip() == third.token
    assert connect(APP, on_code=never).token == third.token


def test_ready_openai_client(keyring_service: LiveDaemon) -> None:
    import openai

    conn = connect(APP, on_code=approve_with_cli([]), poll_interval=0.2)
    client = conn.client
    assert isinstance(client, openai.OpenAI) and str(client.base_url).rstrip("/") == conn.openai_base_url
    assert [m.id for m in client.models.list()]


def test_denied_pairing_is_refused(keyring_service: LiveDaemon) -> None:
    def deny(pairing: PairingRequest) -> None:
        done = cli("tokens", "deny", pairing.user_code)
        assert done.returncode == 0, done.stderr

    with pytest.raises(PairingRefused, match="denied"):
        connect(APP, on_code=deny, poll_interval=0.2)
    assert connect_module.stored_token(APP) is None


def test_no_service(lmsp_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(connect_module, "DEFAULT_URL", nowhere)
    with pytest.raises(ServiceNotFound, match="not running") as err:
        connect(APP, on_code=never)
    assert nowhere in str(err.value)
    with pytest.raises(ServiceNotFound):
        connect(APP, url=nowhere + "/v1", on_code=never)
