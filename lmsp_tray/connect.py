"""Connect an app to the running lmsp-tray: find it, pair once, keep the token in the OS keyring.

Why: an app on the same device should not make its user copy a secret around.
One call does the whole flow an app needs::

    from lmsp_tray.connect import connect

    conn = connect("Notes App", ["models:read", "responses:create"])
    client = conn.client  # an openai.OpenAI for conn.openai_base_url, when `openai` is installed
    client.chat.completions.create(model="gemma3:270m-q4-k-m", messages=[...])

`connect` finds the running service (the discovery file `service.json` of
this user's lmsp-tray, else the default port 7373 on loopback; `url=` or
`LMSP_TRAY_URL` to point elsewhere on loopback — any other host is refused).
If the OS keyring holds a token for the app (service: the app's name, user:
``lmsp-tray``) and the service still accepts it, that token is used.
Otherwise it asks to pair (``POST /lmsp/v1/auth/pairings``), shows the user
code (`on_code`; by default a line on stderr), and waits while the person
approves it in the tray or with ``lmsp-tray tokens approve CODE``; the new
token goes into the keyring under the app's name, so the next run reuses it, and a token revoked since then
makes it pair again. A token is checked with ``GET /lmsp/v1/auth/tokens``
(401: unknown or revoked; 403: valid — an endpoint `keyless_scopes` never
opens, so a service that lets token-less apps in cannot make a revoked token
look valid); a token that lacks a scope the app needs now is not noticed
(call `forget` and connect again).

This module is a client: it imports nothing of the service (no llama.cpp,
Starlette or tray) and talks to it over HTTP through `lmsp_tray.client`
(standard library only; loopback URLs only, never through a proxy).
Without a working keyring the pairing still succeeds and the token is
returned, but it cannot be kept (`Connection.stored` is False): the next run
pairs again.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lmsp_tray.auth.vault import KeyringUnavailable, SecretVault
from lmsp_tray.client import finding, loopback
from lmsp_tray.config import DEFAULT_PORT

DEFAULT_SCOPES = ("models:read", "responses:create")
KEYRING_USER = "lmsp-tray"  # the keyring entry's user name; its service is the app's name
URL_ENV = "LMSP_TRAY_URL"
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
API = finding.API


class ConnectError(Exception):
    """Connecting failed; `str()` is a sentence to show the person."""


class ServiceNotFound(ConnectError):
    """No lmsp-tray answers (not running, or elsewhere)."""


class PairingRefused(ConnectError):
    """The person denied the pairing, or it expired before anyone approved it."""


@dataclass(frozen=True)
class PairingRequest:
    """What the person must approve: shown by `on_code`."""

    app_name: str
    scopes: tuple[str, ...]
    user_code: str
    expires_at: float
    service_url: str

    def instructions(self) -> str:
        return (
            f"lmsp-tray: '{self.app_name}' asks for access ({', '.join(self.scopes)}). Approve code "
            f"{self.user_code} in the lmsp-tray menu, or run: lmsp-tray tokens approve {self.user_code}"
        )


@dataclass(frozen=True)
class Connection:
    """Where the service is and the app's token."""

    app_name: str
    url: str  # the service's root, e.g. http://127.0.0.1:7373
    token: str
    paired: bool = False  # this call paired anew (False: the stored token was reused)
    stored: bool = True  # the token is kept in the OS keyring

    @property
    def lmsp_url(self) -> str:
        return self.url + API

    @property
    def openai_base_url(self) -> str:
        """The base URL for OpenAI-compatible clients (`/v1`)."""
        return self.url + "/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def client(self) -> Any:
        """An `openai.OpenAI` client for this service, or None when the `openai` package is missing."""
        try:
            import openai
        except ImportError:
            return None
        return openai.OpenAI(base_url=self.openai_base_url, api_key=self.token)


# -- HTTP ------------------------------------------------------------------------------------------


def _request(
    method: str, url: str, body: Mapping[str, Any] | None = None, token: str | None = None, timeout: float = 10.0
) -> tuple[int, Any]:
    """(status, decoded JSON body or None); a connection failure raises OSError."""
    reply = loopback.request(method, url, body, token=token, timeout=timeout)
    return reply.status, reply.doc()


def _detail(doc: Any) -> str:
    if isinstance(doc, dict):
        return str(doc.get("detail") or doc.get("title") or doc)
    return "no details"


def find_service(url: str | None = None, *, timeout: float = 2.0) -> str:
    """The running service's root URL: `url` (or `LMSP_TRAY_URL`) if given, else the one this user's
    lmsp-tray announces in its discovery file, else the default port on loopback."""
    try:
        return finding.find_root(url or os.environ.get(URL_ENV), default_url=DEFAULT_URL, timeout=timeout)
    except loopback.NotLoopback as exc:
        raise ConnectError(f"lmsp-tray: {exc}.") from None
    except finding.NothingAnswers as exc:
        raise ServiceNotFound(
            f"lmsp-tray is not running (nothing answers at {exc.where}). Start it (run `lmsp-tray`, or from "
            "your applications menu) and try again."
        ) from None


# -- the keyring -----------------------------------------------------------------------------------


def _vault(app_name: str, backend: Any = None) -> SecretVault:
    return SecretVault(backend, service=app_name)


def stored_token(app_name: str, *, keyring_backend: Any = None) -> str | None:
    """The token kept for `app_name`, if any (raises `KeyringUnavailable` without a keyring)."""
    return _vault(app_name, keyring_backend).load(KEYRING_USER)


def forget(app_name: str, *, keyring_backend: Any = None) -> bool:
    """Remove the app's stored token from the keyring (the next `connect` pairs again)."""
    return _vault(app_name, keyring_backend).delete(KEYRING_USER)


# -- pairing ---------------------------------------------------------------------------------------


def _print_code(pairing: PairingRequest) -> None:
    print(pairing.instructions(), file=sys.stderr, flush=True)


def token_works(root: str, token: str, *, timeout: float = 10.0) -> bool:
    """Whether the service accepts `token`: asked on an endpoint that `keyless_scopes` never opens
    (`tokens:manage`), so 401 means unknown or revoked and 403 a valid token without that scope."""
    status, doc = _request("GET", root + API + "/auth/tokens", token=token, timeout=timeout)
    if status in (200, 403):
        return True
    if status == 401:
        return False
    raise ConnectError(f"lmsp-tray answered {status} when checking the token: {_detail(doc)}")


def pair(
    root: str,
    app_name: str,
    scopes: Iterable[str] = DEFAULT_SCOPES,
    *,
    on_code: Callable[[PairingRequest], None] | None = None,
    timeout: float = 600.0,
    poll_interval: float = 1.0,
) -> str:
    """Ask the service at `root` for a token for `app_name` and wait until the person approves it."""
    wanted = list(dict.fromkeys(scopes))
    status, doc = _request("POST", root + API + "/auth/pairings", {"app_name": app_name, "scopes": wanted})
    if status != 202 or not isinstance(doc, dict):
        raise ConnectError(f"lmsp-tray refused to start pairing ({status}): {_detail(doc)}")
    poll_url = root + str(doc["poll_url"])
    poll_token = str(doc["poll_token"])
    request = PairingRequest(app_name, tuple(doc["scopes"]), str(doc["user_code"]), float(doc["expires_at"]), root)
    (on_code or _print_code)(request)
    deadline = time.monotonic() + timeout
    while True:
        status, doc = _request("GET", poll_url, token=poll_token)
        state = doc.get("status") if isinstance(doc, dict) else None
        if status == 200 and state == "approved" and isinstance(doc, dict) and doc.get("token"):
            return str(doc["token"])
        if state in ("denied", "expired") or status in (404, 410):
            raise PairingRefused(f"The pairing of '{app_name}' was {state or 'ended'}; connect again to retry.")
        if status != 200:
            raise ConnectError(f"lmsp-tray answered {status} while waiting for approval: {_detail(doc)}")
        if time.monotonic() >= deadline:
            raise PairingRefused(f"Nobody approved '{app_name}' within {timeout:.0f} s; connect again to retry.")
        time.sleep(poll_interval)


def connect(
    app_name: str,
    scopes: Iterable[str] = DEFAULT_SCOPES,
    *,
    url: str | None = None,
    on_code: Callable[[PairingRequest], None] | None = None,
    timeout: float = 600.0,
    poll_interval: float = 1.0,
    keyring_backend: Any = None,
) -> Connection:
    """Find the service, reuse the app's stored token or pair anew, and return the connection.

    `on_code(pairing)` shows the person the code to approve (default: a line on stderr); `timeout`
    bounds the wait for approval. Raises `ServiceNotFound`, `PairingRefused` or `ConnectError`.
    """
    root = find_service(url)
    vault = _vault(app_name, keyring_backend)
    try:
        token = vault.load(KEYRING_USER)
        keyring_ok = True
    except KeyringUnavailable:
        token, keyring_ok = None, False
    if token and token_works(root, token):
        return Connection(app_name, root, token, paired=False, stored=True)
    token = pair(root, app_name, scopes, on_code=on_code, timeout=timeout, poll_interval=poll_interval)
    stored = False
    if keyring_ok:
        try:
            vault.store(KEYRING_USER, token, label=f"lmsp-tray token for {app_name}")
            stored = True
        except KeyringUnavailable:
            pass
    return Connection(app_name, root, token, paired=True, stored=stored)
