"""The CLI's client of the running service: where it listens, the token to reach it, and calls.

Why a module of its own: `tokens`, `pull` and `open` all act through the running service when
there is one, with the same credentials (``LMSP_TRAY_TOKEN``, else the owner token from the OS
keyring, else the owner token file the service wrote for this run) and the same one-line errors
(`CommandError`: a refused request prints the problem's detail and code). The HTTP itself, and
the rule that the token never leaves loopback, are `lmsp_tray.client`'s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from lmsp_tray.client.finding import answers, find_running
from lmsp_tray.client.loopback import NotLoopback, Reply, request
from lmsp_tray.config import Paths
from lmsp_tray.instance import InstanceInfo, read_info, wait_for_url

TOKEN_ENV = "LMSP_TRAY_TOKEN"
URL_WAIT_S = 15.0  # how long a command waits for a starting service to listen
CALL_TIMEOUT_S = 60.0


class CommandError(Exception):
    """A failure to report as one line on stderr (exit status 1)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code  # the problem's `code` when the service refused the request


class ServiceUnreachable(CommandError):
    """The service could not be reached, or the connection broke before its answer came."""


def holder_url(paths: Paths, holder: InstanceInfo) -> str:
    """The URL of the service that holds this home's lock, once it listens and answers there."""
    info = wait_for_url(paths, holder, URL_WAIT_S)
    if info.url is None:
        raise CommandError(
            f"lmsp-tray is starting (pid {info.pid}) but does not listen yet; nothing was changed. Try again."
        )
    if not answers(info.url, timeout=5):
        raise CommandError(
            f"lmsp-tray runs for this data folder (pid {info.pid}) but does not answer at {info.url}; nothing "
            "was changed, so no token was made that it would not know. Try again when it answers, or stop it "
            "with `lmsp-tray stop` and run this command again."
        )
    return str(info.url)


def credentials(paths: Paths, holder: InstanceInfo | None) -> str:
    """LMSP_TRAY_TOKEN, else the owner token from the keyring, else the owner token file."""
    from lmsp_tray.auth.vault import KeyringUnavailable, OwnerTokenFile, SecretVault, TokenFileError

    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    runtime = Path(holder.runtime_dir) if holder is not None and holder.runtime_dir else paths.runtime_dir
    try:
        owner_id = json.loads((runtime / paths.discovery_file.name).read_text(encoding="utf-8")).get("owner_token_id")
    except (OSError, ValueError, AttributeError):
        owner_id = None
    keyring_problem = ""
    if owner_id:
        try:
            secret = SecretVault().load(owner_id)
        except KeyringUnavailable as exc:
            secret, keyring_problem = None, str(exc.reason)
        if secret:
            return secret
        keyring_problem = keyring_problem or "the owner token is missing from the OS keyring"
    try:
        return OwnerTokenFile(runtime / "owner-token").read()
    except TokenFileError as exc:
        file_problem = str(exc)
    why = f"{keyring_problem}; " if keyring_problem else ""
    raise CommandError(
        f"cannot authenticate to the running lmsp-tray: {why}{file_problem}. Set {TOKEN_ENV} to a token with "
        "the tokens:manage scope, or restart lmsp-tray (it makes a new owner token)."
    )


def find_service(paths: Paths) -> tuple[str, str] | None:
    """(URL, token) of this home's running service; None when none answers. Raises `CommandError`
    when one answers but no token to reach it is found."""
    running = find_running(paths)
    if running is None:
        return None
    return running.url, credentials(paths, read_info(paths))


class ServiceAPI:
    """Calls to the running service's LMSP API (`url`: ``…/lmsp/v1``) with a bearer token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None) -> Any:
        """The decoded JSON answer; `CommandError` when refused, `ServiceUnreachable` when not reached."""
        try:
            reply = request(method, self.url + path, body, token=self.token, headers=headers, timeout=CALL_TIMEOUT_S)
        except NotLoopback as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise ServiceUnreachable(f"cannot reach lmsp-tray at {self.url}: {type(exc).__name__}") from None
        if reply.status >= 400:
            line, code = _problem_line(reply)
            raise CommandError(line, code=code)
        try:
            return json.loads(reply.body)
        except ValueError as exc:
            raise CommandError(f"cannot reach lmsp-tray at {self.url}: {type(exc).__name__}") from None


def _problem_line(reply: Reply) -> tuple[str, str | None]:
    """The line to print for a refused request, and the problem's code."""
    doc = reply.doc()
    detail, code = (doc.get("detail"), doc.get("code")) if isinstance(doc, dict) else (None, None)
    if code == "unauthorized":
        return (
            f"the service refused the token ({detail}): if {TOKEN_ENV} is set, check it; otherwise restart "
            "lmsp-tray, which makes a new owner token."
        ), code
    return f"{detail or reply.reason} ({code or reply.status})", code


def quote_part(part: str) -> str:
    """`part` quoted to stand as one segment of a URL path."""
    return quote(part, safe="")
