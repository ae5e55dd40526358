"""`lmsp-tray tokens …`: create, list and revoke tokens; approve or deny app pairings.

Why a module of its own: the commands have two ways to act. While the
service runs they call its API (so revocation reaches its in-memory check at
once), authenticated with ``LMSP_TRAY_TOKEN`` if set, else with the owner
token from the OS keyring (the discovery file names its id). With no service
running they open the data folder directly. ``tokens create`` prints only
the secret on stdout, so ``TOKEN=$(lmsp-tray tokens create …)`` works;
everything else goes to stderr. No command ever prints a traceback or a
secret other than the one just created.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

from lmsp_tray.auth.tokens import SCOPES
from lmsp_tray.config import Config, Paths

TOKEN_ENV = "LMSP_TRAY_TOKEN"


class CommandError(Exception):
    """A failure to report as one line on stderr (exit status 1)."""


def add_parser(commands: Any) -> None:
    tokens = commands.add_parser(
        "tokens",
        help="manage API tokens and app pairing requests",
        description="Manage bearer tokens. While the service runs these commands use its API with the owner "
        f"token from the OS keyring (or ${TOKEN_ENV}); otherwise they act on the data folder directly.",
    )
    actions = tokens.add_subparsers(dest="tokens_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a token and print its secret (only) on stdout")
    create.add_argument("--name", required=True, help="a name to recognize the token by")
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        choices=SCOPES,
        metavar="SCOPE",
        help=f"a scope to grant (repeatable): {', '.join(SCOPES)}",
    )
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.add_argument("--json", action="store_true", help="print JSON token objects")
    revoke = actions.add_parser("revoke", help="revoke a token: refused from the next request on")
    revoke.add_argument("id", help="the token id (tok_…) from `tokens list`")
    approve = actions.add_parser("approve", help="approve an app's pairing request by its code")
    approve.add_argument("code", help="the code the app shows (e.g. BCDF-GHJK)")
    deny = actions.add_parser("deny", help="deny an app's pairing request by its code")
    deny.add_argument("code", help="the code the app shows")
    actions.add_parser("pairings", help="list pairing requests waiting for approval")


def run(paths: Paths, config: Config, args: argparse.Namespace) -> int:
    logging.getLogger("lmsp_tray").addHandler(logging.NullHandler())  # this command reports in its own words
    try:
        return _dispatch(paths, args)
    except CommandError as exc:
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return 1


def _dispatch(paths: Paths, args: argparse.Namespace) -> int:
    from lmsp_tray.instance import find_running

    running = find_running(paths)
    action = args.tokens_command
    if running is not None:
        api = ServiceAPI(running.url, _credentials(paths))
        if action == "create":
            doc = api.call("POST", "/auth/tokens", {"name": args.name, "scopes": args.scope})
            return _created(doc["id"], doc["secret"], None if doc.get("in_keyring") else "")
        if action == "list":
            return _print_tokens(api.call("GET", "/auth/tokens")["data"], as_json=args.json)
        if action == "revoke":
            doc = api.call("POST", f"/auth/tokens/{_quote(args.id)}/revoke")
            print(f"revoked {doc['id']} ({doc['name']})", file=sys.stderr)
            return 0
        if action in ("approve", "deny"):
            doc = api.call("POST", f"/auth/pairings/{_quote(args.code)}/{action}")
            verb = "approved" if action == "approve" else "denied"
            print(f"{verb} {doc['app_name']!r} ({', '.join(doc['scopes'])}), code {doc['user_code']}", file=sys.stderr)
            return 0
        if action == "pairings":
            return _print_pairings(api.call("GET", "/auth/pairings")["data"])
    return _direct(paths, args)


# -- with no service: the data folder ------------------------------------------------------------
def _direct(paths: Paths, args: argparse.Namespace) -> int:
    from lmsp_tray.auth.tokens import StoreTokenRepository, TokenManager, token_object
    from lmsp_tray.auth.vault import SecretVault
    from lmsp_tray.errors import LMSPError
    from lmsp_tray.store import Database, StoreError

    action = args.tokens_command
    if action in ("approve", "deny", "pairings"):
        raise CommandError("lmsp-tray is not running; pairing requests exist only while the service runs.")
    try:
        db = Database(paths.database)
    except StoreError as exc:
        raise CommandError(f"cannot open the token database: {exc}") from None
    try:
        manager = TokenManager(StoreTokenRepository(db), SecretVault())
        if action == "create":
            issued = manager.create(args.name, args.scope)
            return _created(issued.record.id, issued.secret, issued.keyring_problem)
        if action == "list":
            return _print_tokens(
                [token_object(r, owner=manager.is_owner(r)) for r in manager.tokens()], as_json=args.json
            )
        if action == "revoke":
            record = manager.revoke(args.id)
            print(f"revoked {record.id} ({record.name})", file=sys.stderr)
            return 0
    except LMSPError as exc:
        raise CommandError(exc.detail) from None
    finally:
        db.close()
    raise CommandError(f"unknown action {action!r}")


# -- with a running service: its API ------------------------------------------------------------
def _credentials(paths: Paths) -> str:
    """LMSP_TRAY_TOKEN, else the owner token from the keyring (its id is in the discovery file)."""
    from lmsp_tray.auth.vault import KeyringUnavailable, SecretVault

    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    try:
        owner_id = json.loads(paths.discovery_file.read_text(encoding="utf-8")).get("owner_token_id")
    except (OSError, ValueError, AttributeError):
        owner_id = None
    if not owner_id:
        raise CommandError(
            "the running service has no owner token in the OS keyring (the keyring was unavailable when it "
            f"started). Set {TOKEN_ENV} to a token with the tokens:manage scope, or stop the service and run "
            "this command again to act on the data folder directly."
        )
    try:
        secret = SecretVault().load(owner_id)
    except KeyringUnavailable as exc:
        raise CommandError(f"cannot read the owner token: {exc}") from None
    if not secret:
        raise CommandError(
            f"the owner token is missing from the OS keyring. Restart lmsp-tray to create a new "
            f"one, or set {TOKEN_ENV} to a token with the tokens:manage scope."
        )
    return secret


class ServiceAPI:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self._token = token

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        # No proxies: the owner token must never travel anywhere but the loopback service.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=60) as reply:  # loopback URL from service.json
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            raise CommandError(_problem_line(exc)) from None
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot reach lmsp-tray at {self.url}: {type(exc).__name__}") from None


def _problem_line(exc: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(exc.read())
        detail, code = doc.get("detail"), doc.get("code")
    except (OSError, ValueError, AttributeError):
        detail, code = None, None
    if code == "unauthorized":
        return (
            f"the service refused the token ({detail}) — if {TOKEN_ENV} is set, check it; otherwise restart "
            "lmsp-tray so it re-reads the owner token from the keyring."
        )
    return f"{detail or exc.reason} ({code or exc.code})"


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


# -- output ---------------------------------------------------------------------------------------
def _created(token_id: str, secret: str, keyring_problem: str | None) -> int:
    print(secret)  # the only thing on stdout: TOKEN=$(lmsp-tray tokens create …)
    sys.stdout.flush()
    print(f"created {token_id}; this is the only time its secret is shown.", file=sys.stderr)
    if keyring_problem is not None:
        why = f" because {keyring_problem}" if keyring_problem else ""
        print(f"lmsp-tray: warning: the secret was not saved in the OS keyring{why}", file=sys.stderr)
    return 0


def _when(seconds: Any) -> str:
    return "-" if seconds is None else datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def _print_tokens(tokens: list[dict[str, Any]], *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(tokens, indent=2, ensure_ascii=False))
        return 0
    if not tokens:
        print("No tokens.")
        return 0
    print(f"{'ID':<31} {'NAME':<24} {'CREATED':<16} {'LAST USED':<16} {'STATUS':<8} SCOPES")
    for t in tokens:
        status = "revoked" if t["revoked_at"] else ("owner" if t.get("owner") else "active")
        print(
            f"{t['id']:<31} {t['name'][:24]:<24} {_when(t['created_at']):<16} {_when(t['last_used_at']):<16} "
            f"{status:<8} {' '.join(t['scopes'])}"
        )
    return 0


def _print_pairings(pairings: list[dict[str, Any]]) -> int:
    if not pairings:
        print("No pairing requests are waiting.")
        return 0
    print(f"{'CODE':<10} {'APP':<32} {'EXPIRES':<16} SCOPES")
    for p in pairings:
        print(f"{p['user_code']:<10} {p['app_name'][:32]:<32} {_when(p['expires_at']):<16} {' '.join(p['scopes'])}")
    return 0
