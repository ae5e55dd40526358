"""App pairing: a local app without a token asks for one, and the user approves it.

Why: a new local app should not need the user to copy a secret around. The
app sends ``POST /lmsp/v1/auth/pairings {app_name, scopes}`` (no token) and
gets an unguessable pairing id, a short ``user_code`` to show its user, and
a ``poll_token`` only it knows. The user sees the request in the tray (app
name, scopes, code) or runs ``lmsp-tray tokens approve CODE``; the app polls
``GET /lmsp/v1/auth/pairings/{id}`` with ``Authorization: Bearer
<poll_token>`` and receives the new token exactly once after approval.
Denied and expired are final states.

Pairings live in memory: a restart of the service cancels pending ones (the
app simply asks again). Anyone on the machine may ask, so a flood must neither
grow without bound nor lock a real app out: one app name may ask
`per_app_per_minute` times a minute (then 429, Retry-After at most a minute)
and keep `per_app_pending` requests waiting (a newer one supersedes its
oldest); at `max_pending` waiting requests in all, a new one expires the oldest
request of the app name holding the most — so a flood under one name crowds
out only itself, and a request is never refused for others' flooding. The
person dismisses a flood in one action (`deny_all`: the tray, `lmsp-tray
tokens deny --all`, `POST /auth/pairings/dismiss`). `PairingBroker` is
thread-safe: the HTTP thread and the tray's thread both call it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ulid import ULID

from lmsp_tray.auth.tokens import TokenManager, check_name, check_scopes, generate_secret
from lmsp_tray.errors import Conflict, InvalidRequest, NotFound, TooManyRequests

log = logging.getLogger("lmsp_tray.auth.pairing")

PENDING, APPROVED, DENIED, EXPIRED = "pending", "approved", "denied", "expired"
CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ23456789"  # no vowels (no words), no 0/O/1/I
CODE_LENGTH = 8
POLL_PREFIX = "lmspp_"
MAX_RECENT = 4096  # requests remembered for the per-app rate (a flood of names must not make each request slower)


@dataclass(frozen=True)
class RateLimits:
    """How many pairing requests are accepted (sliding one-minute windows)."""

    per_app_per_minute: int = 5
    per_app_pending: int = 2
    max_pending: int = 16
    max_kept: int = 256  # requests remembered in all (pending and final), so a flood cannot grow memory
    window_s: float = 60.0


@dataclass(frozen=True)
class PairingView:
    """What the tray and the CLI show about a pairing request (nothing secret)."""

    id: str
    app_name: str
    scopes: tuple[str, ...]
    user_code: str
    status: str
    created_at: float
    expires_at: float
    token_id: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "pairing",
            "app_name": self.app_name,
            "scopes": list(self.scopes),
            "user_code": self.user_code,
            "status": self.status,
            "created_at": int(self.created_at),
            "expires_at": int(self.expires_at),
            "token_id": self.token_id,
        }


@dataclass
class _Pairing:
    id: str
    app_name: str
    scopes: tuple[str, ...]
    user_code: str
    poll_hash: str = field(repr=False)
    created_at: float
    expires_at: float
    status: str = PENDING
    token_id: str | None = None
    secret: str | None = field(default=None, repr=False)  # held from approval until collected
    collected: bool = False

    def view(self) -> PairingView:
        return PairingView(
            self.id,
            self.app_name,
            self.scopes,
            self.user_code,
            self.status,
            self.created_at,
            self.expires_at,
            self.token_id,
        )


def _pairing_id() -> str:
    """``pair_`` + a ULID whose 80 random bits are all fresh (no monotonic increment: unguessable)."""
    millis = int(time.time() * 1000).to_bytes(6, "big")
    return f"pair_{ULID.from_bytes(millis + os.urandom(10))}"


def _user_code() -> str:
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    return f"{raw[:4]}-{raw[4:]}"


def normalize_code(code: str) -> str:
    clean = "".join(ch for ch in code.upper() if ch.isalnum())
    return f"{clean[:4]}-{clean[4:]}" if len(clean) == CODE_LENGTH else clean


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class PairingBroker:
    """Pending pairing requests and their outcome; the tray backend calls the same methods as HTTP."""

    def __init__(
        self,
        tokens: TokenManager,
        *,
        ttl_s: float = 300.0,
        limits: RateLimits = RateLimits(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens
        self.ttl_s = ttl_s
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._pairings: dict[str, _Pairing] = {}
        self._recent: deque[tuple[float, str]] = deque()  # (time, app_name) of accepted requests
        self._listeners: list[Callable[[PairingView], None]] = []

    # -- for the tray ------------------------------------------------------------------------------
    def add_listener(self, listener: Callable[[PairingView], None]) -> None:
        """Call `listener(view)` on every new request and every change of state (from any thread)."""
        with self._lock:
            self._listeners.append(listener)

    def pending_pairings(self) -> list[PairingView]:
        """Requests waiting for the user, oldest first."""
        with self._lock:
            changed = self._expire_locked(self.clock())
            views = [p.view() for p in self._pairings.values() if p.status == PENDING]
        self._notify(changed)
        return views

    def approve(self, ref: str) -> PairingView:
        """Approve by pairing id or user code: the token is created now and handed out once."""
        pairing = self._pending(ref)
        issued = self.tokens.create(f"{pairing.app_name} (paired)", pairing.scopes)
        with self._lock:
            if pairing.status != PENDING:  # raced with deny/expiry
                late = True
            else:
                late = False
                pairing.status, pairing.token_id, pairing.secret = APPROVED, issued.record.id, issued.secret
                pairing.expires_at = self.clock() + self.ttl_s  # the app now has ttl to collect
                view = pairing.view()
        if late:
            self.tokens.revoke(issued.record.id)
            raise Conflict(f"The pairing request is {pairing.status}; it can no longer be approved.")
        log.info("pairing %s approved for %r (token %s)", pairing.id, pairing.app_name, issued.record.id)
        self._notify([view])
        return view

    def deny(self, ref: str) -> PairingView:
        pairing = self._pending(ref)
        with self._lock:
            if pairing.status != PENDING:
                raise Conflict(f"The pairing request is {pairing.status}; it can no longer be denied.")
            pairing.status = DENIED
            view = pairing.view()
        log.info("pairing %s denied for %r", pairing.id, pairing.app_name)
        self._notify([view])
        return view

    # -- for the requesting app -----------------------------------------------------------------
    def request(self, app_name: object, scopes: object) -> tuple[PairingView, str]:
        """A new pending request and its poll token (returned to the requester only)."""
        name = check_name(app_name, param="app_name")
        if not isinstance(scopes, list):
            raise InvalidRequest("'scopes' must be a list of scope names.", param="scopes")
        wanted = check_scopes(scopes)
        now = self.clock()
        poll_token = generate_secret(POLL_PREFIX)
        with self._lock:
            changed = self._expire_locked(now)
            self._check_rate_locked(name, now)
            changed += self._make_room_locked(name)
            pairing = _Pairing(
                _pairing_id(), name, wanted, self._unique_code_locked(), _digest(poll_token), now, now + self.ttl_s
            )
            self._pairings[pairing.id] = pairing
            self._recent.append((now, name))
            view = pairing.view()
        log.info("pairing %s requested by %r for %s (code %s)", pairing.id, name, " ".join(wanted), view.user_code)
        self._notify([*changed, view])
        return view, poll_token

    def deny_all(self) -> list[PairingView]:
        """Deny every pending request at once (a flood dismissed in one action); the denied ones."""
        with self._lock:
            changed = self._expire_locked(self.clock())
            denied = []
            for pairing in self._pairings.values():
                if pairing.status == PENDING:
                    pairing.status = DENIED
                    denied.append(pairing.view())
        if denied:
            log.info("%d pairing requests denied at once", len(denied))
        self._notify([*changed, *denied])
        return denied

    def poll(self, pairing_id: str, poll_token: str | None) -> tuple[PairingView, str | None]:
        """The request's state; after approval, the token's secret exactly once."""
        with self._lock:
            changed = self._expire_locked(self.clock())
            pairing = self._pairings.get(pairing_id)
            if pairing is None or poll_token is None or not hmac.compare_digest(_digest(poll_token), pairing.poll_hash):
                pairing = None
            elif pairing.status == APPROVED and pairing.collected:
                raise Conflict("The token of this pairing was already collected; it is handed out only once.")
            secret = None
            if pairing is not None and pairing.status == APPROVED:
                secret, pairing.secret, pairing.collected = pairing.secret, None, True
            view = pairing.view() if pairing is not None else None
        self._notify(changed)
        if view is None:
            raise NotFound("There is no pairing request with this id and poll token.")
        return view, secret

    # -- internals ------------------------------------------------------------------------------
    def _pending(self, ref: str) -> _Pairing:
        now = self.clock()
        with self._lock:
            changed = self._expire_locked(now)
            code = normalize_code(ref)
            found = self._pairings.get(ref) or next(
                (p for p in self._pairings.values() if p.user_code == code and p.status == PENDING), None
            )
        self._notify(changed)
        if found is None:
            raise NotFound(f"No pairing request has the id or code {ref[:40]!r}.")
        if found.status != PENDING:
            raise Conflict(f"The pairing request is {found.status}; only pending requests can be approved or denied.")
        return found

    def _check_rate_locked(self, name: str, now: float) -> None:
        limits = self.limits
        while self._recent and (self._recent[0][0] <= now - limits.window_s or len(self._recent) > MAX_RECENT):
            self._recent.popleft()
        mine = [t for t, n in self._recent if n == name]
        if len(mine) >= limits.per_app_per_minute:
            retry = 1 + int(mine[0] + limits.window_s - now)  # when this app's oldest request leaves the window
            raise TooManyRequests(
                f"Too many pairing requests from {name!r}; try again in {retry} s.", headers={"Retry-After": str(retry)}
            )

    def _make_room_locked(self, name: str) -> list[PairingView]:
        """Expire what a new request from `name` displaces: its own oldest beyond `per_app_pending`, and at
        `max_pending` the oldest of the name holding the most; forget the oldest final ones past `max_kept`."""
        limits = self.limits
        pending = [p for p in self._pairings.values() if p.status == PENDING]  # oldest first (insertion order)
        displaced: list[_Pairing] = []
        own = [p for p in pending if p.app_name == name]
        while len(own) >= limits.per_app_pending:
            displaced.append(own.pop(0))
        pending = [p for p in pending if p not in displaced]
        while len(pending) >= limits.max_pending:
            counts: dict[str, int] = {}
            for p in pending:
                counts[p.app_name] = counts.get(p.app_name, 0) + 1
            busiest = max(counts.values())
            victim = next(p for p in pending if counts[p.app_name] == busiest)
            displaced.append(victim)
            pending.remove(victim)
        for p in displaced:
            p.status, p.secret = EXPIRED, None
        if displaced:
            log.info("%d pending pairing requests displaced by newer ones", len(displaced))
        final = [p for p in self._pairings.values() if p.status != PENDING]
        for p in final[: max(0, len(self._pairings) + 1 - limits.max_kept)]:
            del self._pairings[p.id]
        return [p.view() for p in displaced]

    def _unique_code_locked(self) -> str:
        taken = {p.user_code for p in self._pairings.values()}
        while True:
            code = _user_code()
            if code not in taken:
                return code

    def _expire_locked(self, now: float) -> list[PairingView]:
        """Move overdue requests to `expired`; forget final ones after a while. Returns the changed."""
        changed: list[PairingView] = []
        revoke: list[str] = []
        for pairing in list(self._pairings.values()):
            if pairing.status in (PENDING, APPROVED) and not pairing.collected and now >= pairing.expires_at:
                if pairing.status == APPROVED and pairing.token_id:
                    revoke.append(pairing.token_id)  # approved but never collected: nobody holds it
                pairing.status, pairing.secret = EXPIRED, None
                changed.append(pairing.view())
            elif now >= pairing.expires_at + 3600:
                del self._pairings[pairing.id]
        for token_id in revoke:
            threading.Thread(target=self._revoke_quietly, args=(token_id,), daemon=True).start()
        return changed

    def _revoke_quietly(self, token_id: str) -> None:
        try:
            self.tokens.revoke(token_id)
        except Exception as exc:  # noqa: BLE001 — logged, nothing a caller can do
            log.warning("could not revoke uncollected pairing token %s: %s", token_id, type(exc).__name__)

    def _notify(self, views: list[PairingView]) -> None:
        if not views:
            return
        with self._lock:
            listeners = list(self._listeners)
        for view in views:
            for listener in listeners:
                try:
                    listener(view)
                except Exception:
                    log.exception("pairing listener failed")


@dataclass(frozen=True)
class Auth:
    """Tokens and pairings together: what the HTTP layer and the tray backend are given by the daemon.

    For the tray: ``auth.tokens.owner_secret`` (the token to hand the user), ``auth.tokens.keyring_error``
    (None, or a `KeyringUnavailable`: `.reason` is short for the menu, `str()` says what to do), ``auth.pairings.pending_pairings()``,
    ``approve(id_or_code)``, ``deny(id_or_code)`` and ``add_listener(fn)`` for notifications.
    """

    tokens: TokenManager
    pairings: PairingBroker
