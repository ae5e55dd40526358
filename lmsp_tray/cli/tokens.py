"""`lmsp-tray tokens …`: create, list and revoke tokens; approve or deny app pairings.

Why a module of its own: the commands have two ways to act, and must never
pick the wrong one. Whether a service runs for this data folder is decided by
the per-home lock (`lmsp_tray.instance`), not by a probe that a busy service
or another terminal's `XDG_RUNTIME_DIR` could fool:

- a service holds the lock: the commands call its API (so a new token works
  and a revocation applies at once), at the URL the service published next to
  the lock, authenticated with ``LMSP_TRAY_TOKEN`` if set, else with the owner
  token from the OS keyring (the discovery file names its id), else — no
  keyring — with the owner token file the service wrote for this run. A
  service that does not answer is an error: nothing is made behind its back;
- nobody holds it: the command takes the lock (so no service starts meanwhile)
  and works on the data folder directly.

``tokens create`` prints only the secret on stdout, so
``TOKEN=$(lmsp-tray tokens create …)`` works; everything else goes to stderr.
No command ever prints a traceback or a secret other than the one just created.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import datetime
from typing import Any

from lmsp_tray.auth.tokens import SCOPES
from lmsp_tray.cli.service import TOKEN_ENV, CommandError, ServiceAPI, credentials, holder_url, quote_part
from lmsp_tray.config import Config, Paths


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
    deny = actions.add_parser("deny", help="deny an app's pairing request by its code, or all of them")
    deny.add_argument("code", nargs="?", help="the code the app shows")
    deny.add_argument("--all", action="store_true", help="deny every pending request (dismiss a flood)")
    actions.add_parser("pairings", help="list pairing requests waiting for approval")


def run(paths: Paths, config: Config, args: argparse.Namespace) -> int:
    logging.getLogger("lmsp_tray").addHandler(logging.NullHandler())  # this command reports in its own words
    try:
        return _dispatch(paths, args)
    except CommandError as exc:
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return 1


LOCK_WAIT_S = 30.0


def _dispatch(paths: Paths, args: argparse.Namespace) -> int:
    from lmsp_tray.instance import COMMAND, SERVICE, InstanceLock, read_info, write_info

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        lock = InstanceLock(paths)
        try:
            got = lock.acquire()
        except OSError as exc:
            raise CommandError(f"cannot use the data folder {paths.data_dir}: {exc.strerror or exc}") from None
        if got:
            try:
                write_info(paths, COMMAND)
                return _direct(paths, args)
            finally:
                lock.release()
        holder = read_info(paths)
        if holder is not None and holder.role == SERVICE and holder.alive:
            return _via_service(paths, holder, args)
        if time.monotonic() > deadline:
            raise CommandError(f"the data folder {paths.data_dir} is locked by another lmsp-tray command; try again")
        time.sleep(0.05)


def _via_service(paths: Paths, holder: Any, args: argparse.Namespace) -> int:
    action = args.tokens_command
    api = ServiceAPI(holder_url(paths, holder), credentials(paths, holder))
    if action == "create":
        doc = api.call("POST", "/auth/tokens", {"name": args.name, "scopes": args.scope})
        return _created(doc["id"], doc["secret"], None if doc.get("in_keyring") else "")
    if action == "list":
        return _print_tokens(api.call("GET", "/auth/tokens")["data"], as_json=args.json)
    if action == "revoke":
        doc = api.call("POST", f"/auth/tokens/{quote_part(args.id)}/revoke")
        print(f"revoked {doc['id']} ({doc['name']})", file=sys.stderr)
        return 0
    if action == "deny" and getattr(args, "all", False):
        denied = api.call("POST", "/auth/pairings/dismiss")["data"]
        print(f"denied {len(denied)} pairing request(s)", file=sys.stderr)
        return 0
    if action in ("approve", "deny"):
        if not args.code:
            raise CommandError(
                f"name the code the app shows (lmsp-tray tokens {action} CODE)"
                + (", or deny them all with --all" if action == "deny" else "")
            )
        doc = api.call("POST", f"/auth/pairings/{quote_part(args.code)}/{action}")
        verb = "approved" if action == "approve" else "denied"
        print(f"{verb} {doc['app_name']!r} ({', '.join(doc['scopes'])}), code {doc['user_code']}", file=sys.stderr)
        return 0
    if action == "pairings":
        return _print_pairings(api.call("GET", "/auth/pairings")["data"])
    raise CommandError(f"unknown action {action!r}")


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


# -- output ---------------------------------------------------------------------------------------
def _created(token_id: str, secret: str, keyring_problem: str | None) -> int:
    print(secret)  # the only thing on stdout: TOKEN=$(lmsp-tray tokens create …)
    sys.stdout.flush()
    print(f"created {token_id}; it works now, and this is the only time its secret is shown.", file=sys.stderr)
    if keyring_problem is not None:
        why = f" ({keyring_problem})" if keyring_problem else ""
        print(
            f"lmsp-tray: note: the OS keyring could not keep a copy of the secret{why}; the printed secret is "
            "the only one, so store it where your app reads it.",
            file=sys.stderr,
        )
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
