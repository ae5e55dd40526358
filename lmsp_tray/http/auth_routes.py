"""Endpoints for tokens and app pairing, and the OpenAPI document.

Why separate from `routes`: these handlers talk to `TokenManager` and
`PairingBroker` (`request.app.state.auth`), not to the model service, and
the CLI and local apps are their only clients. The scope each one needs is
declared with its route below. Keyring calls block, so creating, revoking and
approving run on a worker thread. A secret appears in exactly two answers:
the `POST /auth/tokens` that created it and the one poll that collects a
paired token.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.auth.pairing import Auth
from lmsp_tray.auth.tokens import token_object
from lmsp_tray.errors import InvalidRequest, Unauthorized
from lmsp_tray.http.api import PUBLIC, Scoped
from lmsp_tray.http.openapi import build_openapi
from lmsp_tray.http.routes import JSON, read_json
from lmsp_tray.http.security import REALM, bearer


def _auth(request: Request) -> Auth:
    return request.app.state.auth


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


# -- tokens ---------------------------------------------------------------------------------------
async def list_tokens(request: Request) -> Response:
    tokens = _auth(request).tokens
    return JSON({"object": "list", "data": [token_object(r, owner=tokens.is_owner(r)) for r in tokens.tokens()]})


async def create_token(request: Request) -> Response:
    body = _object(await read_json(request))
    if "name" not in body:
        raise InvalidRequest("Give the token a 'name'.", param="name")
    if "scopes" not in body or not isinstance(body["scopes"], list):
        raise InvalidRequest("'scopes' must be a list of scope names.", param="scopes")
    tokens = _auth(request).tokens
    issued = await asyncio.to_thread(tokens.create, body["name"], body["scopes"])
    doc = {**token_object(issued.record), "secret": issued.secret, "in_keyring": issued.in_keyring}
    return JSON(doc, status_code=201, headers={"Cache-Control": "no-store"})


async def revoke_token(request: Request) -> Response:
    tokens = _auth(request).tokens
    record = await asyncio.to_thread(tokens.revoke, request.path_params["token_id"])
    return JSON(token_object(record, owner=tokens.is_owner(record)))


# -- pairings -------------------------------------------------------------------------------------
async def create_pairing(request: Request) -> Response:
    body = _object(await read_json(request))
    if "app_name" not in body:
        raise InvalidRequest("Say which app asks: 'app_name'.", param="app_name")
    if "scopes" not in body:
        raise InvalidRequest("Say which 'scopes' the app needs.", param="scopes")
    view, poll_token = _auth(request).pairings.request(body["app_name"], body["scopes"])
    doc = {**view.to_json(), "poll_token": poll_token, "poll_url": f"/lmsp/v1/auth/pairings/{view.id}"}
    return JSON(
        doc, status_code=202, headers={"Cache-Control": "no-store", "Location": f"/lmsp/v1/auth/pairings/{view.id}"}
    )


async def poll_pairing(request: Request) -> Response:
    poll_token = bearer(request.scope["headers"])
    if poll_token is None:
        raise Unauthorized(
            "Send the pairing's poll token as `Authorization: Bearer <poll_token>`.",
            headers={"WWW-Authenticate": REALM},
        )
    view, secret = _auth(request).pairings.poll(request.path_params["pairing_id"], poll_token)
    doc: dict[str, Any] = view.to_json()
    if secret is not None:
        doc["token"] = secret
    return JSON(doc, headers={"Cache-Control": "no-store"})


async def list_pairings(request: Request) -> Response:
    views = _auth(request).pairings.pending_pairings()
    return JSON({"object": "list", "data": [v.to_json() for v in views]})


async def approve_pairing(request: Request) -> Response:
    view = await asyncio.to_thread(_auth(request).pairings.approve, request.path_params["ref"])
    return JSON(view.to_json())


async def deny_pairing(request: Request) -> Response:
    view = await asyncio.to_thread(_auth(request).pairings.deny, request.path_params["ref"])
    return JSON(view.to_json())


async def dismiss_pairings(request: Request) -> Response:
    """Deny every pending request at once: how a person dismisses a flood of them."""
    views = await asyncio.to_thread(_auth(request).pairings.deny_all)
    return JSON({"object": "list", "data": [v.to_json() for v in views]})


async def tokens_endpoint(request: Request) -> Response:
    return await (create_token(request) if request.method == "POST" else list_tokens(request))


async def pairings_endpoint(request: Request) -> Response:
    return await (create_pairing(request) if request.method == "POST" else list_pairings(request))


# -- OpenAPI --------------------------------------------------------------------------------------
async def openapi_document(request: Request) -> Response:
    """Built per request so the examples name a model that is really there."""
    entries = [e for e in request.app.state.service.catalog.entries() if e.ok]
    return JSON(build_openapi(entries[0].id if entries else None))


# Under /lmsp/v1, each with the scope each method needs.
AUTH_ROUTES = [
    Scoped("/openapi.json", openapi_document, GET=PUBLIC),
    Scoped("/auth/tokens", tokens_endpoint, GET="tokens:manage", POST="tokens:manage"),
    Scoped("/auth/tokens/{token_id}/revoke", revoke_token, POST="tokens:manage"),
    # Asking to pair needs no token (rate-limited; the user decides); polling needs the pairing's poll token.
    Scoped("/auth/pairings", pairings_endpoint, GET="tokens:manage", POST=PUBLIC),
    Scoped("/auth/pairings/dismiss", dismiss_pairings, POST="tokens:manage"),  # before {pairing_id}
    Scoped("/auth/pairings/{pairing_id}", poll_pairing, GET=PUBLIC),
    Scoped("/auth/pairings/{ref}/approve", approve_pairing, POST="tokens:manage"),
    Scoped("/auth/pairings/{ref}/deny", deny_pairing, POST="tokens:manage"),
]
