"""Bearer tokens: issuing, checking, revoking, and the owner token.

Why this module: every request but the service document carries a bearer
token, so checking one must be cheap, constant-time and independent of the
keyring. A token is an id (``tok_…``), a name, scopes and a secret
``lmsp_`` + ``secrets.token_urlsafe(32)`` (256 bits). The database keeps the
metadata and the SHA-256 of the secret (a secret with 256 bits of entropy
needs no salt or slow hash); the secret itself goes to the OS keyring
(`lmsp_tray.auth.vault`) and is shown once to whoever asked for it.
`TokenManager` keeps an in-memory map hash → token, filled at start and
updated by its own create/revoke, so a revocation is effective on the very
next request and the keyring is never touched on the request path.

The owner token (name ``lmsp-tray owner``, all scopes) is created at first
start and kept in the keyring for the tray and the CLI; one made before a
scope was added is replaced at the next start. Keyring entries are labelled
with the token's name ("lmsp-tray token: my-app"). The console page has a
token of its own (``lmsp-tray console``, `lmsp_tray.auth.console`); apps
cannot take either name.

Without a usable keyring (none installed, locked, no D-Bus) — the
documented fallback:
- checking tokens keeps working (hashes are in the database);
- the daemon makes a *session owner token* for this run: in memory (the
  in-process tray uses it) and, for the CLI, in the owner token file
  (`vault.OwnerTokenFile`: the runtime folder, 0600, removed at exit), never
  in the database;
- `lmsp-tray tokens create` reaches the running service with it and the
  service makes the token — usable at once, its secret printed once;
- the daemon tries the keyring again now and then (`retry_keyring`); once it
  works, a persistent owner token goes there, the file goes, and listeners
  (the tray) hear of it. The session token stays valid until the run ends.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from lmsp_tray.auth.vault import KeyringUnavailable, SecretVault, token_label
from lmsp_tray.errors import Conflict, InvalidRequest, NotFound
from lmsp_tray.ids import new_id
from lmsp_tray.store import access_tokens as store_tokens
from lmsp_tray.store.access_tokens import LastUsedBatcher, TokenRecord
from lmsp_tray.store.database import Database

log = logging.getLogger("lmsp_tray.auth.tokens")

SCOPES: tuple[str, ...] = (
    "models:read",
    "models:manage",
    "responses:create",
    "responses:read",
    "tasks:create",
    "tasks:read",
    "tokens:manage",
    "activity:read",
    "settings:manage",
)
RESERVED_SCOPES = frozenset({"tools:execute"})  # LMSP §10: reserved for tool-running extensions; never granted
SECRET_PREFIX = "lmsp_"
SECRET_BYTES = 32
OWNER_NAME = "lmsp-tray owner"
CONSOLE_NAME = "lmsp-tray console"  # the console page's own token (`lmsp_tray.auth.console`)
RESERVED_NAMES = frozenset({OWNER_NAME, CONSOLE_NAME})
MAX_NAME = 64
MAX_PRESENTED = 256  # longer "tokens" are rejected before hashing


def generate_secret(prefix: str = SECRET_PREFIX) -> str:
    """A fresh secret: the prefix plus 256 random bits, URL-safe."""
    return prefix + secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class TokenRepository(Protocol):
    """Where token metadata persists (`StoreTokenRepository`; `MemoryTokenRepository` in unit tests)."""

    def insert(self, record: TokenRecord) -> None: ...
    def get(self, token_id: str) -> TokenRecord | None: ...
    def list(self) -> list[TokenRecord]: ...  # all tokens, revoked too, oldest first
    def revoke(self, token_id: str, now: float) -> bool: ...
    def note_used(self, token_id: str, when: float) -> None: ...


class StoreTokenRepository:
    """Token metadata in the SQLite store; last-used times are batched (the housekeeper writes them)."""

    def __init__(self, db: Database, last_used: LastUsedBatcher | None = None) -> None:
        self.db = db
        self.last_used = last_used if last_used is not None else LastUsedBatcher()

    def insert(self, record: TokenRecord) -> None:
        self.db.write_sync(store_tokens.insert, record)

    def get(self, token_id: str) -> TokenRecord | None:
        record = self.db.read(store_tokens.get, token_id)
        return self._fresh(record) if record is not None else None

    def list(self) -> list[TokenRecord]:
        return [self._fresh(r) for r in self.db.read(store_tokens.list_tokens)]

    def revoke(self, token_id: str, now: float) -> bool:
        return self.db.write_sync(store_tokens.revoke, token_id, now=now)

    def note_used(self, token_id: str, when: float) -> None:
        self.last_used.note(token_id, when)

    def _fresh(self, record: TokenRecord) -> TokenRecord:
        pending = self.last_used.pending(record.id)
        if pending is not None and (record.last_used_at is None or pending > record.last_used_at):
            return replace(record, last_used_at=pending)
        return record


class MemoryTokenRepository:
    """Token metadata in a dict: for unit tests of the logic around the store."""

    def __init__(self, records: Iterable[TokenRecord] = ()) -> None:
        self._lock = threading.Lock()
        self._rows = {r.id: r for r in records}

    def insert(self, record: TokenRecord) -> None:
        with self._lock:
            if record.id in self._rows or any(r.secret_hash == record.secret_hash for r in self._rows.values()):
                raise ValueError("duplicate token")
            self._rows[record.id] = record

    def get(self, token_id: str) -> TokenRecord | None:
        with self._lock:
            return self._rows.get(token_id)

    def list(self) -> list[TokenRecord]:
        with self._lock:
            return sorted(self._rows.values(), key=lambda r: (r.created_at, r.id))

    def revoke(self, token_id: str, now: float) -> bool:
        with self._lock:
            row = self._rows.get(token_id)
            if row is None or row.revoked:
                return False
            self._rows[token_id] = replace(row, revoked_at=now)
            return True

    def note_used(self, token_id: str, when: float) -> None:
        with self._lock:
            row = self._rows.get(token_id)
            if row is not None and (row.last_used_at is None or row.last_used_at < when):
                self._rows[token_id] = replace(row, last_used_at=when)


@dataclass(frozen=True)
class IssuedToken:
    """A token just created: the only object that holds its secret (hidden from repr)."""

    record: TokenRecord
    secret: str = field(repr=False)
    keyring_problem: str | None = None  # why the secret could not be saved in the keyring, if so

    @property
    def in_keyring(self) -> bool:
        return self.keyring_problem is None


def check_scopes(scopes: Iterable[str], *, param: str = "scopes") -> tuple[str, ...]:
    """Validated, de-duplicated scopes in canonical order; `tools:execute` is never granted."""
    if isinstance(scopes, (str, bytes)) or not all(isinstance(s, str) for s in scopes):
        raise InvalidRequest("'scopes' must be a list of scope names.", param=param)
    wanted = list(dict.fromkeys(scopes))
    if not wanted:
        raise InvalidRequest(f"Name at least one scope; available: {', '.join(SCOPES)}.", param=param)
    for scope in wanted:
        if scope in RESERVED_SCOPES:
            raise InvalidRequest(f"The scope '{scope}' is reserved and is never granted by lmsp-tray.", param=param)
        if scope not in SCOPES:
            raise InvalidRequest(f"Unknown scope {scope[:40]!r}; available: {', '.join(SCOPES)}.", param=param)
    return tuple(s for s in SCOPES if s in wanted)


# Characters a name shown in the tray and the terminal must not hold: controls, line breaks, invisible and
# bidirectional formatting (which could disguise an app's name). Also the `pattern` in the OpenAPI document.
NAME_FORBIDDEN = "\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u061c\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u206f\\ufeff\\ufff9-\\ufffb"
NAME_PATTERN = f"^[^{NAME_FORBIDDEN}]*$"
_NAME = re.compile(NAME_PATTERN)


def check_name(name: object, *, param: str = "name") -> str:
    """A display name: 1–64 characters, none of them control or invisible formatting characters."""
    if not isinstance(name, str):
        raise InvalidRequest(f"'{param}' must be a string.", param=param)
    if not 1 <= len(name) <= MAX_NAME:
        raise InvalidRequest(f"'{param}' must be 1 to {MAX_NAME} characters.", param=param)
    if not _NAME.fullmatch(name):
        raise InvalidRequest(f"'{param}' must not contain control or invisible formatting characters.", param=param)
    return name


class TokenManager:
    """Creates, checks and revokes tokens; the in-memory hash map is the request-path check."""

    def __init__(
        self, repository: TokenRepository, vault: SecretVault | None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.repository = repository
        self.vault = vault
        self.clock = clock
        self._lock = threading.Lock()
        self._by_hash: dict[str, TokenRecord] = {}
        self._owner_id: str | None = None
        self._owner_secret: str | None = None
        self._owner_ephemeral = False
        self._session: dict[str, TokenRecord] = {}  # session owner tokens of this run, by hash
        self._keyring_error: KeyringUnavailable | None = None
        self._keyring_listeners: list[Callable[[KeyringUnavailable | None], None]] = []
        self.reload()

    # -- keyring state ---------------------------------------------------------------------------
    @property
    def keyring_error(self) -> KeyringUnavailable | None:
        """The last keyring failure (tray: `.reason`), None while the keyring works."""
        return self._keyring_error

    @keyring_error.setter
    def keyring_error(self, error: KeyringUnavailable | None) -> None:
        was = self._keyring_error
        self._keyring_error = error
        if (was is None) != (error is None):
            for listener in list(self._keyring_listeners):
                try:
                    listener(error)
                except Exception:
                    log.warning("keyring listener failed", exc_info=True)

    def add_keyring_listener(self, listener: Callable[[KeyringUnavailable | None], None]) -> None:
        """Call `listener(error)` when the keyring stops working, and `listener(None)` when it works again."""
        self._keyring_listeners.append(listener)

    def retry_keyring(self) -> bool:
        """After a keyring failure: try it again; True when it works now (see the module docstring)."""
        if self._keyring_error is None or self.vault is None:
            return False
        try:
            self.vault.check()
        except KeyringUnavailable as exc:
            self._keyring_error = exc  # same outage (no listener call), newest reason
            return False
        if self._owner_ephemeral:
            issued = self._issue(OWNER_NAME, SCOPES)
            if not issued.in_keyring:  # it failed again between the check and the write
                self._revoke(issued.record)
                return False
            self._set_owner(issued.record, issued.secret, ephemeral=False)
            log.info("the keyring works again: the owner token %s is kept there", issued.record.id)
        else:
            self.keyring_error = None
            log.info("the keyring works again")
        return True

    # -- checking (request path: memory only) ---------------------------------------------------
    def reload(self) -> None:
        """Rebuild the in-memory map from the repository (at start; after outside changes)."""
        active = {r.secret_hash: r for r in self.repository.list() if not r.revoked}
        with self._lock:
            self._by_hash = {**active, **self._session}

    def authenticate(self, presented: str) -> TokenRecord | None:
        """The live token whose secret is `presented`, else None. Constant-time on the hash."""
        if not presented.startswith(SECRET_PREFIX) or len(presented) > MAX_PRESENTED:
            return None
        digest = hash_secret(presented)
        with self._lock:
            record = self._by_hash.get(digest)
        if record is None or not hmac.compare_digest(record.secret_hash, digest):
            return None
        if digest not in self._session:
            self.repository.note_used(record.id, self.clock())
        return record

    # -- managing ------------------------------------------------------------------------------
    def create(self, name: str, scopes: Iterable[str]) -> IssuedToken:
        """A new token; its secret goes to the keyring when one works (see the module docstring)."""
        name = check_name(name)
        if name in RESERVED_NAMES:
            raise InvalidRequest(f"The name '{name}' is reserved for lmsp-tray's own tokens.", param="name")
        return self._issue(name, check_scopes(scopes))

    def create_reserved(self, name: str, scopes: Iterable[str]) -> IssuedToken:
        """A token under one of the `RESERVED_NAMES` (the console's own), which apps cannot take."""
        if name not in RESERVED_NAMES or name == OWNER_NAME:
            raise ValueError(f"{name!r} is not a reserved token name")
        return self._issue(name, check_scopes(scopes))

    def secret_of(self, record: TokenRecord) -> str | None:
        """The secret of `record` from the keyring, if it is there and matches (blocking: 0.1-0.3 s)."""
        if self.vault is None:
            return None
        try:
            secret = self.vault.load(record.id)
        except KeyringUnavailable as exc:
            self.keyring_error = exc
            return None
        if secret and hmac.compare_digest(hash_secret(secret), record.secret_hash):
            return secret
        return None

    def _issue(self, name: str, scopes: tuple[str, ...]) -> IssuedToken:
        secret = generate_secret()
        record = TokenRecord(new_id("tok"), name, scopes, self.clock(), hash_secret(secret))
        problem = None
        try:
            if self.vault is None:
                raise KeyringUnavailable("no keyring is configured", kind="no_backend")
            self.vault.store(record.id, secret, token_label(name))
        except KeyringUnavailable as exc:
            problem = str(exc)
            self.keyring_error = exc
            log.warning(
                "token %s (%s) was created but its secret is not in the keyring: %s", record.id, name, exc.reason
            )
        try:
            self.repository.insert(record)
        except BaseException:
            if problem is None:
                self._forget_secret(record.id)
            raise
        with self._lock:
            self._by_hash[record.secret_hash] = record
        log.info("created token %s (%s) with scopes %s", record.id, name, " ".join(scopes))
        return IssuedToken(record, secret, problem)

    def revoke(self, token_id: str) -> TokenRecord:
        """Revoke a token: refused from the next request on. The owner token is refused here."""
        record = self.get(token_id)
        if token_id == self._owner_id:
            raise Conflict(
                "The owner token is used by the tray and the CLI and cannot be revoked while the "
                "service runs. Stop the service and run `lmsp-tray tokens revoke` to replace it.",
                param="id",
            )
        return self._revoke(record)

    def _revoke(self, record: TokenRecord) -> TokenRecord:
        now = self.clock()
        if not record.revoked:
            self.repository.revoke(record.id, now)
        with self._lock:
            self._by_hash.pop(record.secret_hash, None)
        self._forget_secret(record.id)
        log.info("revoked token %s (%s)", record.id, record.name)
        return self.repository.get(record.id) or replace(record, revoked_at=now)

    def get(self, token_id: str) -> TokenRecord:
        record = self.repository.get(token_id) if isinstance(token_id, str) else None
        if record is None:
            raise NotFound(
                f"There is no token with id {str(token_id)[:40]!r}; `lmsp-tray tokens list` shows them.", param="id"
            )
        return record

    def tokens(self) -> list[TokenRecord]:
        return self.repository.list()

    def is_owner(self, record: TokenRecord) -> bool:
        return record.id == self._owner_id or record.name == OWNER_NAME

    def _forget_secret(self, token_id: str) -> None:
        if self.vault is None:
            return
        try:
            self.vault.delete(token_id)
        except KeyringUnavailable as exc:
            self.keyring_error = exc
            log.warning("could not remove the keyring entry of %s: %s", token_id, exc.reason)

    @property
    def keyring_problem(self) -> str | None:
        """A sentence for the user when the keyring failed last time it was used, else None."""
        return None if self.keyring_error is None else str(self.keyring_error)

    # -- the owner token -----------------------------------------------------------------------
    @property
    def owner_secret(self) -> str | None:
        """The owner token's secret for in-process users (the tray); never logged or shown."""
        return self._owner_secret

    @property
    def owner_id(self) -> str | None:
        return self._owner_id

    @property
    def owner_ephemeral(self) -> bool:
        """True when the owner token lives only in memory for this run (no keyring)."""
        return self._owner_ephemeral

    def ensure_owner(self) -> None:
        """Find the owner token's secret in the keyring, or create one; without a keyring, a session token."""
        owners = [r for r in self.repository.list() if r.name == OWNER_NAME and not r.revoked]
        try:
            if self.vault is None:
                raise KeyringUnavailable("no keyring is configured", kind="no_backend")
            for record in reversed(owners):
                if set(record.scopes) != set(SCOPES):
                    continue  # made before a scope was added: replaced below by one with every scope
                secret = self.vault.load(record.id)
                if secret and hmac.compare_digest(hash_secret(secret), record.secret_hash):
                    self._set_owner(record, secret, ephemeral=False)
                    return
            self.vault.check()
        except KeyringUnavailable as exc:
            self.keyring_error = exc
            log.warning("%s", exc)
            self._session_owner()
            return
        for record in owners:  # secrets gone from the keyring (nobody can use them), or scopes outdated
            self._revoke(record)
        issued = self._issue(OWNER_NAME, SCOPES)
        if not issued.in_keyring:  # the keyring failed between the check and the write
            self._revoke(issued.record)
            self._session_owner()
            return
        self._set_owner(issued.record, issued.secret, ephemeral=False)

    def _session_owner(self) -> None:
        secret = generate_secret()
        record = TokenRecord(new_id("tok"), OWNER_NAME, SCOPES, self.clock(), hash_secret(secret))
        with self._lock:
            self._session[record.secret_hash] = record
            self._by_hash[record.secret_hash] = record
        self._set_owner(record, secret, ephemeral=True)
        log.warning("using a session owner token for this run only (the keyring is unavailable)")

    def _set_owner(self, record: TokenRecord, secret: str, *, ephemeral: bool) -> None:
        self._owner_id, self._owner_secret, self._owner_ephemeral = record.id, secret, ephemeral
        if not ephemeral:
            self.keyring_error = None


def token_object(record: TokenRecord, *, owner: bool = False) -> dict[str, object]:
    """The public JSON shape of a token (never its secret or hash)."""
    return {
        "id": record.id,
        "object": "token",
        "name": record.name,
        "scopes": list(record.scopes),
        "created_at": int(record.created_at),
        "last_used_at": None if record.last_used_at is None else int(record.last_used_at),
        "revoked_at": None if record.revoked_at is None else int(record.revoked_at),
        "owner": owner,
    }
