"""Who may talk to the API: Host and Origin checks, CORS, bearer tokens and scopes.

Why pure ASGI (not Starlette's BaseHTTPMiddleware): it must not buffer or
wrap streaming responses, and must keep disconnect detection intact. Every
request passes, in this order:

1. **Host** — only ``127.0.0.1``, ``localhost`` or ``[::1]`` (any port) are
   served; anything else, an empty or a missing Host → ``403 forbidden_host``.
   This defeats DNS rebinding: a page on ``attacker.example`` that resolves
   to 127.0.0.1 still sends ``Host: attacker.example``.
2. **Origin** — a request with an ``Origin`` that is neither the service's
   own (``http://`` + the Host it was sent to: the console page served under
   ``/console/``) nor on the configured allow-list → ``403
   forbidden_origin``. The own origin needs and gets no CORS header.
   Without configured origins no CORS header is ever sent; with them, the
   exact origin is echoed (never ``*``), and preflight ``OPTIONS`` requests
   are answered here.
3. **Bearer token and scope** — each route declares the scope each of its
   methods needs (`api.Scoped`; `PUBLIC` for the few that need none), and
   the API the path belongs to says which one this request needs
   (`Api.required_scope`). No, a malformed or an unknown/revoked token →
   ``401 unauthorized`` with ``WWW-Authenticate: Bearer realm="lmsp"``; a
   token without the scope → ``403 insufficient_scope`` with
   ``WWW-Authenticate: Bearer error="insufficient_scope", scope="…"``. Paths
   no route serves still need a valid token (then the router answers
   404/405). Every refusal is written in that API's error shape.
   **Keyless scopes** (`keyless_scopes` in config.toml, off by default): a
   request without a valid token — none, or a placeholder such as ``Bearer
   noop`` that apps written for token-less servers send — is let through
   when the scope it needs is one of them; it runs as the caller "keyless"
   (`KEYLESS`), whose stored responses and tasks no token can read. Host
   and Origin are checked before this, as for everyone.
4. **Declared body size** — a ``Content-Length`` over the limit → ``413``
   before anything is read (`routes.read_body` also counts while reading,
   for chunked bodies).

0. **Header size** — over `MAX_HEADER_BYTES` in total or `MAX_HEADERS`
   headers → ``400 invalid_request``; a URL over `MAX_URL_BYTES` → ``414``.
   h11 (configured in `daemon`) stops buffering a head that grows past
   `MAX_HEAD_BYTES` unfinished, and answers as this layer would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lmsp_tray.auth.tokens import TokenManager, TokenRecord
from lmsp_tray.errors import (
    ForbiddenHost,
    ForbiddenOrigin,
    InsufficientScope,
    InvalidRequest,
    LMSPError,
    PayloadTooLarge,
    Unauthorized,
    UriTooLong,
)
from lmsp_tray.http.api import PUBLIC, Api, api_for
from lmsp_tray.http.problems import send_error

MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 100
MAX_URL_BYTES = 32 * 1024  # path and query string: no route takes more (as much as all the headers)
# How far h11 buffers an unfinished request head: a URL and headers both within their limits, the
# method, version and spacing around them. Past it, at least one limit is broken whichever way the
# head arrives, so h11 refusing it early (http/connections.py) answers as this layer would.
MAX_HEAD_BYTES = MAX_URL_BYTES + MAX_HEADER_BYTES + 1024
STATE_TOKEN = "lmsp_token"  # request.state key holding the caller's TokenRecord
STATE_KEYLESS = "lmsp_keyless"  # request.state key: True when let in by `keyless_scopes`
KEYLESS = "keyless"  # the caller a keyless request runs as

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
REALM = 'Bearer realm="lmsp"'
CORS_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
CORS_HEADERS = (
    "Authorization, Content-Type, LMSP-Version, Idempotency-Key, Last-Event-ID, X-Api-Key, Anthropic-Version, "
    "Anthropic-Beta"
)
CORS_EXPOSE = "LMSP-Version, WWW-Authenticate, Retry-After, Location, Idempotent-Replayed"
CORS_MAX_AGE = "600"
_PORT = re.compile(r"[0-9]{1,5}")


def host_allowed(value: str | None) -> bool:
    """True when a Host header names loopback: 127.0.0.1, localhost or [::1], optionally with a port."""
    if not value:
        return False
    host, port = value.lower(), ""
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return False
        host, rest = host[: end + 1], host[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return False
            port = rest[1:]
            if not port:
                return False
    elif ":" in host:
        host, port = host.split(":", 1)
        if not port:
            return False
    if port and not (_PORT.fullmatch(port) and int(port) <= 65535):
        return False
    return host in LOOPBACK_HOSTS


@dataclass(frozen=True)
class SecurityPolicy:
    allowed_origins: frozenset[str]
    max_request_bytes: int

    @classmethod
    def build(cls, allowed_origins: Iterable[str], max_request_bytes: int) -> SecurityPolicy:
        return cls(frozenset(o.rstrip("/").lower() for o in allowed_origins), max_request_bytes)


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The credentials of the one `Authorization: Bearer …` header, else of the one `x-api-key` header
    (Anthropic's clients send the token there), else None."""
    values = [v for k, v in headers if k == b"authorization"]
    if not values:
        keys = [v for k, v in headers if k == b"x-api-key"]
        values = [b"Bearer " + keys[0]] if len(keys) == 1 else []
    if len(values) != 1:
        return None
    try:
        scheme, _, credentials = values[0].decode("ascii").strip().partition(" ")
    except UnicodeDecodeError:
        return None
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials or " " in credentials:
        return None
    return credentials


class SecurityMiddleware:
    """Host, Origin/CORS, bearer token and scope, and the declared body size — before any route runs."""

    def __init__(
        self,
        app: Any,
        *,
        tokens: TokenManager,
        policy: SecurityPolicy,
        apis: Sequence[Api],
        keyless: Callable[[], Iterable[str]] | None = None,
        keyless_paths: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """`keyless()` names the scopes granted without a valid token now, `keyless_paths()` the paths
        open without one (both read per request, so a change of settings applies at once)."""
        self.app = app
        self.tokens = tokens
        self.policy = policy
        self.apis = list(apis)
        self.keyless = keyless
        self.keyless_paths = keyless_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        api = api_for(self.apis, scope["path"])

        async def refuse(error: LMSPError, send: Any = send) -> None:
            await send_error(send, error, api.errors)

        url = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string") or b"")
        if url > MAX_URL_BYTES:  # answered before routing: a 404 would echo it back, in full
            await refuse(UriTooLong(f"The request URL is {url:,} bytes; the limit is {MAX_URL_BYTES:,} bytes."))
            return
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > MAX_HEADER_BYTES or len(headers) > MAX_HEADERS:
            await refuse(
                InvalidRequest(
                    f"The request headers are too large ({size} bytes in {len(headers)} headers); the limits are "
                    f"{MAX_HEADER_BYTES} bytes and {MAX_HEADERS} headers."
                ),
            )
            return
        hosts = [v for k, v in headers if k == b"host"]
        if len(hosts) != 1 or not host_allowed(hosts[0].decode("latin-1").strip()):
            await refuse(
                ForbiddenHost("This service answers only requests addressed to 127.0.0.1, localhost or [::1].")
            )
            return

        origins = [v for k, v in headers if k == b"origin"]
        origin = origins[0].decode("latin-1").strip() if origins else None
        own_origin = "http://" + hosts[0].decode("latin-1").strip().lower()
        cors: list[tuple[bytes, bytes]] = []
        if origins and not (len(origins) == 1 and origin is not None and origin.rstrip("/").lower() == own_origin):
            if len(origins) != 1 or origin is None or origin.rstrip("/").lower() not in self.policy.allowed_origins:
                await refuse(
                    ForbiddenOrigin(
                        "Requests from this web origin are not allowed. Add it to `allowed_origins` in config.toml "
                        "to let a web page use the API."
                    ),
                )
                return
            cors = [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
                (b"access-control-expose-headers", CORS_EXPOSE.encode()),
            ]
            if scope["method"] == "OPTIONS" and any(k == b"access-control-request-method" for k, _ in headers):
                await self._preflight(send, cors)
                return

        send_out = _with_headers(send, cors) if cors else send
        needed = api.required_scope(scope["method"], scope["path"])
        try:
            try:
                token = self._authorize(needed, headers)
            except (Unauthorized, InsufficientScope):
                if not self._keyless_grants(needed, scope["path"]):
                    raise
                token = None
                scope.setdefault("state", {})[STATE_KEYLESS] = True
            self._check_declared_size(headers)
        except LMSPError as exc:
            await refuse(exc, send_out)
            return
        if token is not None:
            scope.setdefault("state", {})[STATE_TOKEN] = token
        await self.app(scope, receive, send_out)

    def _authorize(self, needed: str | None, headers: list[tuple[bytes, bytes]]) -> TokenRecord | None:
        if needed == PUBLIC:
            return None
        presented = bearer(headers)
        token = self.tokens.authenticate(presented) if presented else None
        if token is None:
            detail = (
                "This endpoint needs `Authorization: Bearer <token>`."
                if presented is None
                else "The bearer token is not valid (unknown, revoked or malformed)."
            )
            raise Unauthorized(detail, headers={"WWW-Authenticate": REALM})
        if needed is not None and needed not in token.scopes:
            raise InsufficientScope(
                f"This token lacks the scope '{needed}' this endpoint needs.",
                headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{needed}"'},
            )
        return token

    def _keyless_grants(self, needed: str | None, path: str) -> bool:
        """Whether `keyless_scopes` lets a request without a valid token in (a path no route serves:
        when any scope is granted, so the router answers 404 rather than 401), or `keyless_paths`
        opens its path (`metrics_keyless`: Prometheus's scrapes of /metrics)."""
        if self.keyless_paths is not None and path in self.keyless_paths():
            return True
        if self.keyless is None:
            return False
        granted = set(self.keyless())
        return bool(granted) and (needed is None or needed in granted)

    def _check_declared_size(self, headers: list[tuple[bytes, bytes]]) -> None:
        for k, v in headers:
            if k == b"content-length" and v.isdigit() and int(v) > self.policy.max_request_bytes:
                raise PayloadTooLarge(
                    f"The request body is {int(v)} bytes; the limit is {self.policy.max_request_bytes} bytes."
                )

    async def _preflight(self, send: Any, cors: list[tuple[bytes, bytes]]) -> None:
        headers = cors + [
            (b"access-control-allow-methods", CORS_METHODS.encode()),
            (b"access-control-allow-headers", CORS_HEADERS.encode()),
            (b"access-control-max-age", CORS_MAX_AGE.encode()),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _with_headers(send: Any, extra: list[tuple[bytes, bytes]]) -> Any:
    async def wrapped(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return wrapped


def token_of(request: Any) -> TokenRecord | None:
    """The token that authorized this request (None on public endpoints and keyless requests)."""
    return request.scope.get("state", {}).get(STATE_TOKEN)


def keyless_of(request: Any) -> bool:
    """Whether this request came in without a valid token, by `keyless_scopes`."""
    return bool(request.scope.get("state", {}).get(STATE_KEYLESS))
