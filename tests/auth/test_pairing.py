"""App pairing end to end over HTTP: request, approval through the CLI, one collection, expiry, limits."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest
from support import LiveDaemon, wait_until

from lmsp_tray.auth.pairing import CODE_ALPHABET
from lmsp_tray.cli.main import main as cli_main


def ask(live: LiveDaemon, app: str = "Notes App", scopes: list[str] | None = None) -> dict:
    r = httpx.post(live.url + "/auth/pairings", json={"app_name": app, "scopes": scopes or ["models:read"]}, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()


def poll(live: LiveDaemon, pairing: dict, poll_token: str | None = None) -> httpx.Response:
    token = pairing["poll_token"] if poll_token is None else poll_token
    return httpx.get(
        f"{live.url}/auth/pairings/{pairing['id']}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


@pytest.fixture
def cli_env(daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch) -> LiveDaemon:
    """The CLI finds the in-process daemon through its discovery file and uses the owner token."""
    monkeypatch.setenv("LMSP_TRAY_TOKEN", daemon.owner_token)
    return daemon


def test_pairing_approved_through_the_cli(cli_env: LiveDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    live = cli_env
    p = ask(live, "Notes App", ["models:read", "responses:create"])
    assert p["status"] == "pending" and p["id"].startswith("pair_") and len(p["id"]) == 31
    assert p["expires_at"] > time.time() and p["poll_token"].startswith("lmspp_")
    code = p["user_code"]
    assert len(code) == 9 and code[4] == "-" and all(ch in CODE_ALPHABET for ch in code.replace("-", ""))
    assert poll(live, p).json()["status"] == "pending"

    # The user sees it (tray backend API and CLI) ...
    [pending] = live.daemon.auth.pairings.pending_pairings()
    assert (pending.app_name, pending.scopes, pending.user_code) == (
        "Notes App",
        ("models:read", "responses:create"),
        code,
    )
    assert cli_main(["tokens", "pairings"]) == 0
    assert code in capsys.readouterr().out
    # ... and approves it with the code, typed loosely.
    assert cli_main(["tokens", "approve", code.lower().replace("-", " ")]) == 0
    assert "approved 'Notes App'" in capsys.readouterr().err

    r = poll(live, p)
    assert r.status_code == 200
    doc = r.json()
    assert doc["status"] == "approved" and doc["token"].startswith("lmsp_") and doc["token_id"].startswith("tok_")
    token = doc["token"]
    # The token works, with exactly the scopes asked for.
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(live.url + "/models", headers=auth, timeout=30).status_code == 200
    assert httpx.get(live.url + "/auth/tokens", headers=auth, timeout=30).status_code == 403
    # A second collection is refused; the token is not shown again.
    again = poll(live, p)
    assert again.status_code == 409 and again.json()["code"] == "conflict" and token not in again.text
    assert live.daemon.auth.pairings.pending_pairings() == []
    listed = httpx.get(live.url + "/auth/tokens", headers=live.auth_headers, timeout=30).json()["data"]
    assert any(t["id"] == doc["token_id"] and t["name"] == "Notes App (paired)" for t in listed)


def test_denied_is_final(cli_env: LiveDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    live = cli_env
    p = ask(live)
    assert cli_main(["tokens", "deny", p["user_code"]]) == 0
    r = poll(live, p)
    assert r.status_code == 200 and r.json()["status"] == "denied" and "token" not in r.json()
    assert cli_main(["tokens", "approve", p["user_code"]]) == 1
    assert "no pairing request" in capsys.readouterr().err.lower()
    r = httpx.post(f"{live.url}/auth/pairings/{p['id']}/approve", headers=live.auth_headers, timeout=30)
    assert r.status_code == 409
    assert poll(live, p).json()["status"] == "denied"


def test_only_the_requester_can_collect(daemon: LiveDaemon) -> None:
    p = ask(daemon)
    other = ask(daemon, "Other App")
    r = httpx.post(f"{daemon.url}/auth/pairings/{p['id']}/approve", headers=daemon.auth_headers, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "approved" and "token" not in r.json()
    # Without the poll token, with another pairing's, or with the owner token: nothing is handed out.
    r = httpx.get(f"{daemon.url}/auth/pairings/{p['id']}", timeout=30)
    assert r.status_code == 401
    for wrong in (other["poll_token"], daemon.owner_token, "lmspp_" + "A" * 43):
        r = poll(daemon, p, wrong)
        assert r.status_code == 404 and "token" not in r.json()
    r = poll(daemon, p)
    assert r.status_code == 200 and r.json()["token"].startswith("lmsp_")


def test_pairing_ids_and_codes_are_unguessable(daemon: LiveDaemon) -> None:
    made = [ask(daemon, f"App {i}") for i in range(4)]
    ids = [p["id"] for p in made]
    # ULIDs made in the same millisecond would normally just count up; pairing ids have fresh random bits.
    randomness = sorted(int.from_bytes(__import__("ulid").ULID.from_str(i[5:]).bytes[6:], "big") for i in ids)
    assert all(b - a > 1 for a, b in itertools.pairwise(randomness))
    assert len({p["user_code"] for p in made}) == 4 and len({p["poll_token"] for p in made}) == 4


def test_expired_is_final(daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = daemon.daemon.auth.pairings
    now = [time.time()]
    monkeypatch.setattr(broker, "clock", lambda: now[0])
    p = ask(daemon)
    now[0] += broker.ttl_s + 1
    r = poll(daemon, p)
    assert r.status_code == 200 and r.json()["status"] == "expired"
    r = httpx.post(f"{daemon.url}/auth/pairings/{p['user_code']}/approve", headers=daemon.auth_headers, timeout=30)
    assert r.status_code in (404, 409)
    r = httpx.post(f"{daemon.url}/auth/pairings/{p['id']}/approve", headers=daemon.auth_headers, timeout=30)
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    assert poll(daemon, p).json()["status"] == "expired"


def test_approved_but_never_collected_expires_and_its_token_is_revoked(
    daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = daemon.daemon.auth.pairings
    now = [time.time()]
    monkeypatch.setattr(broker, "clock", lambda: now[0])
    p = ask(daemon)
    token_id = broker.approve(p["user_code"]).token_id
    now[0] += broker.ttl_s + 1
    r = poll(daemon, p)
    assert r.json()["status"] == "expired" and "token" not in r.json()
    wait_until(lambda: daemon.daemon.auth.tokens.get(token_id).revoked_at is not None, 10, "the token to be revoked")


def test_pairing_requests_are_rate_limited(daemon: LiveDaemon) -> None:
    limits = daemon.daemon.auth.pairings.limits
    for i in range(limits.per_app_per_minute):
        ask(daemon, "Pushy App")
    r = httpx.post(daemon.url + "/auth/pairings", json={"app_name": "Pushy App", "scopes": ["models:read"]}, timeout=30)
    assert r.status_code == 429 and r.json()["code"] == "too_many_requests" and int(r.headers["retry-after"]) >= 1
    # Other apps are still heard: one app's flood locks out no other (tests/http/test_floods_http.py).
    statuses = [
        httpx.post(
            daemon.url + "/auth/pairings", json={"app_name": f"App {i}", "scopes": ["models:read"]}, timeout=30
        ).status_code
        for i in range(limits.max_pending + 4)
    ]
    assert set(statuses) == {202}
    assert len(daemon.daemon.auth.pairings.pending_pairings()) == limits.max_pending
    assert httpx.get(daemon.url, timeout=30).status_code == 200


@pytest.mark.parametrize(
    "payload",
    [
        {"app_name": "", "scopes": ["models:read"]},
        {"app_name": "x" * 65, "scopes": ["models:read"]},
        {"app_name": "evil\u202eapp", "scopes": ["models:read"]},
        {"app_name": "line\nbreak", "scopes": ["models:read"]},
        {"app_name": 5, "scopes": ["models:read"]},
        {"app_name": "ok", "scopes": []},
        {"app_name": "ok", "scopes": "models:read"},
        {"app_name": "ok"},
        ["not", "an", "object"],
    ],
)
def test_bad_pairing_requests(daemon: LiveDaemon, payload: object) -> None:
    r = httpx.post(daemon.url + "/auth/pairings", json=payload, timeout=30)
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    assert daemon.daemon.auth.pairings.pending_pairings() == []


def test_tray_listener_hears_requests_and_decisions(daemon: LiveDaemon) -> None:
    heard = []
    broker = daemon.daemon.auth.pairings
    broker.add_listener(lambda view: heard.append((view.status, view.app_name, view.user_code)))
    p = ask(daemon, "Listener App")
    broker.deny(p["id"])
    assert heard == [("pending", "Listener App", p["user_code"]), ("denied", "Listener App", p["user_code"])]


# -- the tray's side (in process, as the tray backend calls it) -------------------------------------
def test_tray_sees_approves_and_announces_requests(daemon: LiveDaemon, tmp_path) -> None:
    from lmsp_tray.desktop.autostart import Autostart
    from lmsp_tray.desktop.backend import DaemonTrayBackend, tray_hooks
    from lmsp_tray.desktop.service_notices import pairing_text

    autostart = Autostart.for_platform("linux", environ={}, home=tmp_path, command=["lmsp-tray"])
    hooks = tray_hooks(daemon.daemon)
    backend = DaemonTrayBackend(daemon.daemon, autostart, hooks)
    announced: list[tuple[str, str]] = []
    hooks.subscribe_pairings(
        lambda view, *_: announced.append(pairing_text(view, buttons=False) if view.status == "pending" else ("", ""))
    )
    p = ask(daemon, "Notes App", ["models:read", "responses:create"])
    [shown] = backend.snapshot().pairings
    assert (shown.id, shown.app_name, shown.scopes, shown.user_code) == (
        p["id"],
        "Notes App",
        ("models:read", "responses:create"),
        p["user_code"],
    )
    assert announced == [
        (
            "\u201cNotes App\u201d asks for an lmsp-tray token",
            (
                f"It wants: models:read, responses:create. Check that the app shows the code {p['user_code']}. "
                "Approve or deny it in the lmsp-tray menu (Pairing requests)."
            ),
        )
    ]
    assert pairing_text(shown, buttons=True)[1].endswith(f"code {p['user_code']}.")  # the buttons say the rest
    backend.approve_pairing(shown.id)
    assert backend.snapshot().pairings == () and announced[-1] == ("", "")  # decisions are not announced
    token = poll(daemon, p).json()["token"]
    assert token not in repr(backend.snapshot())  # the menu state never holds a secret
    assert backend.access_token() == daemon.owner_token


def test_tray_shows_keyring_trouble(lmsp_home, models_dir, tmp_path) -> None:
    import keyring.backends.fail
    from support import start_daemon

    from lmsp_tray.auth.vault import SecretVault
    from lmsp_tray.desktop.autostart import Autostart
    from lmsp_tray.desktop.backend import DaemonTrayBackend, tray_hooks

    live = start_daemon(models_dir, vault=SecretVault(keyring.backends.fail.Keyring()))
    try:
        autostart = Autostart.for_platform("linux", environ={}, home=tmp_path, command=["lmsp-tray"])
        state = DaemonTrayBackend(live.daemon, autostart, tray_hooks(live.daemon)).snapshot()
        assert state.notice == (
            "Keyring unavailable: no keyring backend is installed or running. Tokens still work; new secrets cannot "
            f"be saved. The owner token for the CLI is kept in {live.daemon.owner_token_file} (only you can read it) "
            "until lmsp-tray stops."
        )
        assert state.token_session_only
        assert state.token_available  # the session owner token still works for this run
    finally:
        live.stop()


def test_cli_ignores_proxy_settings(
    cli_env: LiveDaemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI sends the owner token only to the loopback service, never to a configured proxy."""
    ask(cli_env, "Proxy App")
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # a proxy that does not exist
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert cli_main(["tokens", "pairings"]) == 0  # answered by the running service only
    assert "Proxy App" in capsys.readouterr().out


def test_the_cli_denies_them_all(cli_env: LiveDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    asked = [ask(cli_env, f"Flood {i}") for i in range(5)]
    assert cli_main(["tokens", "deny", "--all"]) == 0
    assert "denied 5 pairing request(s)" in capsys.readouterr().err
    assert all(poll(cli_env, p).json()["status"] == "denied" for p in asked)
    assert cli_main(["tokens", "deny"]) == 1  # neither a code nor --all
    assert "--all" in capsys.readouterr().err
