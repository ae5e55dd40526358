"""HTTP to the service on this machine: the loopback rule, written once.

Why: every request from outside the service (an app's pairing, the CLI with the owner token, a
probe for a running instance) carries a secret or decides where one is sent. So, here and only
here:

- a URL's host must be loopback (127.0.0.0/8, ``::1``, ``localhost``), else `NotLoopback` before
  a byte is sent — the service only ever binds loopback (`config.host`);
- never through a proxy: ``HTTP_PROXY``, ``ALL_PROXY`` and the system's proxy settings are
  ignored (a proxy would see the token; ``NO_PROXY`` is not relied on);
- a redirect is followed only to loopback, so a token never leaves with one (urllib would carry
  the ``Authorization`` header along).

`request` answers every HTTP status with a `Reply` (an error status is an answer too) and raises
`OSError` when nothing answered; `open_stream` is for event streams (`client.sse`).
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import Any
from urllib.parse import urlsplit

LOCALHOST = "localhost"


class NotLoopback(ValueError):
    """A URL that does not point at this machine's loopback: nothing is sent there."""


def is_loopback(url: str) -> bool:
    """Whether `url` is http(s) to a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    if host.lower().rstrip(".") == LOCALHOST:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_loopback(url: str) -> str:
    """`url`, or `NotLoopback` when it points anywhere but this machine's loopback."""
    if not is_loopback(url):
        raise NotLoopback(f"{url!r} is not a loopback URL; lmsp-tray serves only on this machine (127.0.0.1, ::1)")
    return url


class _LoopbackRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to loopback: the request's token must not go with it anywhere else."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        check_loopback(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    # ProxyHandler({}): no proxy at all, whatever the environment or the system says.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _LoopbackRedirects())


def _request(url: str, method: str, body: Any, token: str | None, headers: Mapping[str, str] | None) -> Any:
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(check_loopback(url), data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    return request


@dataclass(frozen=True)
class Reply:
    """The service's answer: its status and body (an error status is an answer too)."""

    status: int
    body: bytes
    reason: str = ""

    def json(self) -> Any:
        """The body decoded as JSON; None when empty. Raises ValueError when it is not JSON."""
        return json.loads(self.body) if self.body else None

    def doc(self) -> Any:
        """The body decoded as JSON, or None when it is empty or not JSON."""
        try:
            return self.json()
        except ValueError:
            return None


def request(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """Send `body` (JSON, when given) to the loopback `url` with the bearer `token`.

    Raises `NotLoopback` for any other URL and `OSError` when the service could not be reached or
    the connection broke before the answer was read."""
    req = _request(url, method, body, token, headers)
    try:
        with _opener().open(req, timeout=timeout) as reply:
            return Reply(reply.status, reply.read(), reply.reason)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read()
        except OSError:
            raw = b""
        return Reply(exc.code, raw, str(exc.reason))


def open_stream(
    url: str, *, token: str | None = None, headers: Mapping[str, str] | None = None, timeout: float = 120.0
) -> HTTPResponse:
    """A GET of the loopback `url` left open to read as it comes (close it, or use it in `with`).

    `timeout` bounds each read. An error status raises `urllib.error.HTTPError` (an OSError), as
    does a failed connection."""
    req = _request(url, "GET", None, token, headers)
    reply: HTTPResponse = _opener().open(req, timeout=timeout)
    return reply
