"""Token logic around the store and the keyring (both real elsewhere: test_keyring, test_security_http).

Here the repository is the real SQLite store in a temp folder where it matters, and the keyring is
replaced by small stand-ins that can be made to fail — the point is what `TokenManager` does then.
"""

from __future__ import annotations

import hashlib
import secrets
import tempfile
from pathlib import Path

import pytest
from secret_audit import find_leaks
from support import MemoryVault

from lmsp_tray.auth.tokens import (
    OWNER_NAME,
    SCOPES,
    MemoryTokenRepository,
    StoreTokenRepository,
    TokenManager,
    check_name,
    check_scopes,
    generate_secret,
    hash_secret,
)
from lmsp_tray.auth.vault import KeyringUnavailable
from lmsp_tray.errors import Conflict, InvalidRequest, NotFound
from lmsp_tray.store import Database


class BrokenVault(MemoryVault):
    def __init__(self, kind: str = "locked") -> None:
        super().__init__()
        self.kind = kind

    def _fail(self, *_: object) -> None:
        raise KeyringUnavailable(f"test says {self.kind}", kind=self.kind)

    check = store = load = delete = _fail  # type: ignore[assignment]


@pytest.fixture
def db(tmp_path: Path):
    database = Database(tmp_path / "t.sqlite3")
    yield database
    database.close()


def test_secrets_are_long_random_and_hashed() -> None:
    a, b = generate_secret(), generate_secret()
    assert a != b and a.startswith("lmsp_") and len(a) == 5 + 43
    assert hash_secret(a) == hashlib.sha256(a.encode()).hexdigest()
    assert generate_secret("lmspp_").startswith("lmspp_")


def test_create_authenticate_revoke_with_the_store(db: Database) -> None:
    vault = MemoryVault()
    manager = TokenManager(StoreTokenRepository(db), vault)
    issued = manager.create("editor", ["models:read", "models:read", "responses:create"])
    assert issued.in_keyring and vault.entries[issued.record.id] == issued.secret
    assert issued.record.scopes == ("models:read", "responses:create")  # canonical order, no repeats
    assert issued.secret not in repr(issued) and issued.record.secret_hash not in repr(issued.record)
    assert manager.authenticate(issued.secret) == issued.record
    for wrong in (
        "",
        "lmsp_",
        issued.secret[:-1],
        issued.secret + "x",
        "Bearer " + issued.secret,
        "lmsp_" + "A" * 1000,
        issued.record.secret_hash,
    ):
        assert manager.authenticate(wrong) is None
    # A second manager over the same database (a restart) knows the token without the keyring.
    again = TokenManager(StoreTokenRepository(db), BrokenVault())
    assert again.authenticate(issued.secret).id == issued.record.id
    revoked = manager.revoke(issued.record.id)
    assert revoked.revoked_at is not None and issued.record.id not in vault.entries
    assert manager.authenticate(issued.secret) is None
    assert TokenManager(StoreTokenRepository(db), vault).authenticate(issued.secret) is None
    with pytest.raises(NotFound):
        manager.revoke("tok_nope")


def test_last_used_is_batched_and_shown(db: Database) -> None:
    repo = StoreTokenRepository(db)
    manager = TokenManager(repo, MemoryVault(), clock=lambda: 1000.0)
    issued = manager.create("t", ["models:read"])
    assert manager.get(issued.record.id).last_used_at is None
    manager.authenticate(issued.secret)
    assert manager.get(issued.record.id).last_used_at == 1000.0  # pending, not yet written
    repo.last_used.flush(db)
    assert (
        db.read(lambda c: c.execute("SELECT last_used_at FROM tokens WHERE id = ?", (issued.record.id,)).fetchone()[0])
        == 1000.0
    )


def test_scopes_and_names_are_checked() -> None:
    assert check_scopes(["tokens:manage", "models:read"]) == ("models:read", "tokens:manage")
    for bad in ([], ["tools:execute"], ["models:read", "tools:execute"], ["admin"], "models:read", [None]):
        with pytest.raises(InvalidRequest):
            check_scopes(bad)  # type: ignore[arg-type]
    assert check_name("My App 2 — ünïcode") == "My App 2 — ünïcode"
    for bad in ("", "x" * 65, "a\nb", "a\x1b[31m", "evil\u202eppa", "zero\u200bwidth", "end\n", 3, None):
        with pytest.raises(InvalidRequest):
            check_name(bad)
    manager = TokenManager(MemoryTokenRepository(), MemoryVault())
    with pytest.raises(InvalidRequest):
        manager.create(OWNER_NAME, ["models:read"])


def test_keyring_failure_still_creates_the_token_and_says_why() -> None:
    repo = MemoryTokenRepository()
    manager = TokenManager(repo, BrokenVault("no_backend"))
    issued = manager.create("offline", ["models:read"])
    assert not issued.in_keyring and "test says no_backend" in (issued.keyring_problem or "")
    assert manager.authenticate(issued.secret) is not None
    assert manager.revoke(issued.record.id).revoked_at is not None  # revoking needs no keyring either


def test_owner_token_found_created_or_session_only() -> None:
    repo, vault = MemoryTokenRepository(), MemoryVault()
    first = TokenManager(repo, vault)
    first.ensure_owner()
    assert not first.owner_ephemeral and first.owner_secret and vault.entries[first.owner_id] == first.owner_secret
    assert set(first.get(first.owner_id).scopes) == set(SCOPES)
    with pytest.raises(Conflict):
        first.revoke(first.owner_id)
    second = TokenManager(repo, vault)
    second.ensure_owner()
    assert (second.owner_id, second.owner_secret) == (first.owner_id, first.owner_secret)
    # Locked keyring: a session owner in memory only; the stored owner is left alone for later.
    locked = TokenManager(repo, BrokenVault("locked"))
    locked.ensure_owner()
    assert locked.owner_ephemeral and "locked" in (locked.keyring_problem or "")
    assert locked.authenticate(locked.owner_secret) is not None
    assert locked.owner_id not in {r.id for r in repo.list()}
    assert not repo.get(first.owner_id).revoked
    locked.reload()
    assert locked.authenticate(locked.owner_secret) is not None  # survives a reload
    # Keyring works but lost the entry: the old owner is revoked and replaced.
    vault.entries.clear()
    third = TokenManager(repo, vault)
    third.ensure_owner()
    assert third.owner_id != first.owner_id and repo.get(first.owner_id).revoked
    assert third.authenticate(first.owner_secret) is None


def test_the_secret_audit_can_find_a_leak() -> None:
    secret = "lmsp_" + secrets.token_urlsafe(32)  # written outside the run's folders: not a leak of the suite
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "deep").mkdir()
        (root / "deep" / "log.txt").write_text(f"noise {secret} noise")
        (root / "other.bin").write_bytes(b"\x00" * 100)
        (root / "note.txt").write_text("lmsp_short and lmsp_" + "x" * 42)  # not secret-shaped
        assert find_leaks(root, {secret}) == {"deep/log.txt"}
        assert find_leaks(root, {"lmspp_" + secrets.token_urlsafe(32)}) == set()
        assert find_leaks(root) == {"deep/log.txt"}  # unknown secrets (issued by subprocesses) are found too
