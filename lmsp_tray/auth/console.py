"""How the console page gets its token: a single-use code, exchanged once, within a minute.

Why: the console (the web page the daemon serves under ``/console/``) is just
another client of the API, with a token of its own — ``lmsp-tray console``,
listed under Apps like any other, scoped to what the page does and
revocable. The page must get that token without a long-lived secret in a
URL (URLs end up in logs, history and other users' ``ps``). So the tray or
``lmsp-tray open`` asks for a *code*: 256 random bits, prefix ``lmspc_``,
good for one exchange within `CODE_TTL_S` seconds. It travels in the URL
*fragment* (``/console/#code=…``), which browsers never send in a request
line, and the page trades it at ``POST /lmsp/v1/console/sessions`` for the
console token, which it keeps in the tab's `sessionStorage` (that origin
only — port included — and gone when the tab closes). Only the SHA-256 of a
code is kept, in memory; codes do not survive a restart.

The console token's secret is kept in the OS keyring like the owner's, so
every console tab (and the conversations it stored, which are owned by the
token) survives restarts. Revoking it under Apps signs every console out;
the next code exchange makes a new one. Without a keyring it lives for this
run only (and is replaced at the next start).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lmsp_tray.auth.tokens import CONSOLE_NAME, TokenManager
from lmsp_tray.errors import TooManyRequests, Unauthorized
from lmsp_tray.store.access_tokens import TokenRecord

log = logging.getLogger("lmsp_tray.auth.console")

CODE_PREFIX = "lmspc_"
CODE_TTL_S = 60.0
MAX_OPEN_CODES = 16  # codes waiting to be exchanged; more means something is looping
# What the page does: chat (stored conversations), models, apps and tokens, activity, settings; tasks
# only to follow and cancel the downloads Discover starts (the console streams its responses itself).
CONSOLE_SCOPES: tuple[str, ...] = (
    "models:read",
    "models:manage",
    "responses:create",
    "responses:read",
    "tasks:read",
    "tasks:create",
    "tokens:manage",
    "activity:read",
    "settings:manage",
)


@dataclass(frozen=True)
class ConsoleCode:
    """A code just issued; `code` is shown only to whoever opens the page."""

    code: str = field(repr=False)
    expires_at: float  # wall-clock seconds


@dataclass(frozen=True)
class ConsoleSession:
    """What a successful exchange hands the page: the console token and its secret."""

    token: TokenRecord
    secret: str = field(repr=False)


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


class ConsoleAccess:
    """Issues single-use codes and exchanges them for the console token. Thread-safe."""

    def __init__(
        self, tokens: TokenManager, *, ttl_s: float = CODE_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.tokens = tokens
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._codes: dict[str, float] = {}  # sha256(code) -> expires_at
        self._token_lock = threading.Lock()  # one keyring lookup or token creation at a time
        self._secret: str | None = None

    def issue_code(self) -> ConsoleCode:
        """A fresh code, good for one exchange within `ttl_s` seconds."""
        now = self.clock()
        code = CODE_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            self._codes = {h: t for h, t in self._codes.items() if t > now}
            if len(self._codes) >= MAX_OPEN_CODES:
                raise TooManyRequests(
                    f"{MAX_OPEN_CODES} console links are waiting to be opened; try again in a minute.",
                    headers={"Retry-After": str(int(self.ttl_s))},
                )
            self._codes[_digest(code)] = now + self.ttl_s
        return ConsoleCode(code, now + self.ttl_s)

    def exchange(self, code: object) -> ConsoleSession:
        """The console token for a valid code; the code is spent whether or not it was still valid.

        Blocking (the keyring, the first time): call it off the event loop."""
        if not isinstance(code, str) or not code.startswith(CODE_PREFIX) or len(code) > 128:
            raise self._refused("This is not a console link code.")
        digest = _digest(code)
        now = self.clock()
        with self._lock:
            expires = next((t for h, t in self._codes.items() if hmac.compare_digest(h, digest)), None)
            if expires is not None:
                del self._codes[digest]
        if expires is None:
            raise self._refused("This console link was already used or is unknown.")
        if now >= expires:
            raise self._refused("This console link has expired (links work for one minute).")
        record, secret = self._console_token()
        log.info("console opened (token %s)", record.id)
        return ConsoleSession(record, secret)

    @staticmethod
    def _refused(why: str) -> Unauthorized:
        return Unauthorized(
            f"{why} Open the console again from the tray menu or with `lmsp-tray open`.",
            headers={"WWW-Authenticate": 'Bearer realm="lmsp"'},
        )

    def _console_token(self) -> tuple[TokenRecord, str]:
        """The live console token: the one in memory, else the one in the keyring, else a new one."""
        tokens = self.tokens
        with self._token_lock:
            if self._secret is not None:
                record = tokens.authenticate(self._secret)
                if record is not None:
                    return record, self._secret
                self._secret = None  # revoked under Apps: make a new one
            found: tuple[TokenRecord, str] | None = None
            stale: list[TokenRecord] = []
            for record in reversed(tokens.tokens()):
                if record.name != CONSOLE_NAME or record.revoked:
                    continue
                secret = None
                if found is None and set(record.scopes) == set(CONSOLE_SCOPES):
                    secret = tokens.secret_of(record)
                if secret is None:
                    stale.append(record)  # its secret is lost (no keyring then), or it predates a scope change
                else:
                    found = (record, secret)
            for record in stale:
                tokens.revoke(record.id)
            if found is None:
                issued = tokens.create_reserved(CONSOLE_NAME, CONSOLE_SCOPES)
                found = (issued.record, issued.secret)
            self._secret = found[1]
            return found
