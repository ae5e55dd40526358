"""The console's way in (auth/console.py): single-use, short-lived codes, and one console token that is
scoped, reserved, kept in the keyring across restarts, and replaced when revoked. Over a real store
and real HTTP where it matters."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from support import MemoryVault

from lmsp_tray.auth.console import CODE_TTL_S, CONSOLE_SCOPES, MAX_OPEN_CODES, ConsoleAccess
from lmsp_tray.auth.tokens import CONSOLE_NAME, OWNER_NAME, SCOPES, MemoryTokenRepository, TokenManager
from lmsp_tray.errors import InvalidRequest, TooManyRequests, Unauthorized


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts() -> tuple[TokenManager, MemoryVault, MemoryTokenRepository]:
    repo, vault = MemoryTokenRepository(), MemoryVault()
    tokens = TokenManager(repo, vault)
    tokens.ensure_owner()
    return tokens, vault, repo


def test_a_code_works_once(parts) -> None:
    access = ConsoleAccess(parts[0])
    code = access.issue_code().code
    session = access.exchange(code)
    assert session.token.name == CONSOLE_NAME and set(session.token.scopes) == set(CONSOLE_SCOPES)
    assert parts[0].authenticate(session.secret) is not None
    with pytest.raises(Unauthorized, match="already used"):
        access.exchange(code)


def test_a_code_expires_after_a_minute(parts) -> None:
    clock = Clock()
    access = ConsoleAccess(parts[0], clock=clock)
    code = access.issue_code().code
    clock.now += CODE_TTL_S + 0.01
    with pytest.raises(Unauthorized, match="expired"):
        access.exchange(code)
    with pytest.raises(Unauthorized, match="already used"):  # spent by the failed try, too
        access.exchange(code)


@pytest.mark.parametrize("bad", [None, 5, "", "lmsp_" + "A" * 43, "lmspc_" + "A" * 200, "lmspc_unknown"])
def test_anything_else_is_refused(parts, bad: object) -> None:
    with pytest.raises(Unauthorized):
        ConsoleAccess(parts[0]).exchange(bad)


def test_unused_codes_are_bounded(parts) -> None:
    clock = Clock()
    access = ConsoleAccess(parts[0], clock=clock)
    for _ in range(MAX_OPEN_CODES):
        access.issue_code()
    with pytest.raises(TooManyRequests):
        access.issue_code()
    clock.now += CODE_TTL_S + 1  # expired ones make room
    access.issue_code()


def test_one_console_token_kept_in_the_keyring_across_restarts(parts) -> None:
    tokens, vault, repo = parts
    access = ConsoleAccess(tokens)
    first = access.exchange(access.issue_code().code)
    again = access.exchange(access.issue_code().code)
    assert again.token.id == first.token.id and vault.entries[first.token.id] == first.secret
    # A restart: a new manager and console over the same store and keyring find the same token.
    restarted = TokenManager(repo, vault)
    restarted.ensure_owner()
    fresh = ConsoleAccess(restarted)
    after = fresh.exchange(fresh.issue_code().code)
    assert after.token.id == first.token.id and after.secret == first.secret
    assert [t.name for t in restarted.tokens() if not t.revoked].count(CONSOLE_NAME) == 1


def test_a_revoked_console_token_is_replaced(parts) -> None:
    tokens = parts[0]
    access = ConsoleAccess(tokens)
    first = access.exchange(access.issue_code().code)
    tokens.revoke(first.token.id)  # from Apps: every console is signed out
    assert tokens.authenticate(first.secret) is None
    second = access.exchange(access.issue_code().code)
    assert second.token.id != first.token.id and tokens.authenticate(second.secret) is not None


def test_a_console_token_whose_secret_is_lost_is_replaced(parts) -> None:
    tokens, vault, repo = parts
    access = ConsoleAccess(tokens)
    first = access.exchange(access.issue_code().code)
    vault.entries.pop(first.token.id)  # e.g. made while the keyring was down
    restarted = TokenManager(repo, vault)
    fresh = ConsoleAccess(restarted)
    second = fresh.exchange(fresh.issue_code().code)
    assert second.token.id != first.token.id
    assert restarted.get(first.token.id).revoked


def test_the_console_name_is_reserved(parts) -> None:
    for name in (CONSOLE_NAME, OWNER_NAME):
        with pytest.raises(InvalidRequest, match="reserved"):
            parts[0].create(name, ["models:read"])


def test_an_owner_made_before_new_scopes_is_replaced(parts) -> None:
    tokens, vault, repo = parts
    old = tokens.get(tokens.owner_id)
    # An owner from an older version, without the newer scopes.
    repo._rows[old.id] = replace(old, scopes=tuple(s for s in SCOPES if s not in ("activity:read", "settings:manage")))
    restarted = TokenManager(repo, vault)
    restarted.ensure_owner()
    assert restarted.owner_id != old.id and set(restarted.get(restarted.owner_id).scopes) == set(SCOPES)
    assert restarted.get(old.id).revoked and old.id not in vault.entries


def test_exchange_over_http_gives_a_working_scoped_token(daemon) -> None:
    code = daemon.daemon.console_access.issue_code().code
    r = httpx.post(daemon.url + "/console/sessions", json={"code": code}, timeout=30)
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    doc = r.json()
    headers = {"Authorization": f"Bearer {doc['token']}"}
    assert httpx.get(daemon.url + "/settings", headers=headers, timeout=30).status_code == 200
    # Tasks: only to follow and cancel the downloads Discover starts; it sees its own tasks, none yet.
    assert httpx.get(daemon.url + "/tasks", headers=headers, timeout=30).json()["data"] == []
    again = httpx.post(daemon.url + "/console/sessions", json={"code": code}, timeout=30)
    assert again.status_code == 401 and again.json()["code"] == "unauthorized"
    # A link from the API (what `lmsp-tray open` asks for) carries a code in its fragment.
    link = httpx.post(daemon.url + "/console/codes", headers=daemon.auth_headers, timeout=30).json()
    assert link["url"].startswith(daemon.base + "/console/#code=lmspc_")
    plain = {"Authorization": f"Bearer {daemon.owner_token}"}
    assert httpx.post(daemon.url + "/console/codes", timeout=30).status_code == 401
    assert httpx.post(daemon.url + "/console/codes", headers=plain, timeout=30).status_code == 201
