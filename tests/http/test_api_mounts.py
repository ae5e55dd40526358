"""A second API next to /lmsp/v1 declares its own scopes and its own error shape (as an OpenAI-style /v1 will).

A unit test of the mounting logic around the real security layer and router (through httpx's ASGI transport);
/lmsp/v1 itself is tested over real sockets in test_security_http.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from support import MemoryVault

from lmsp_tray.auth.tokens import MemoryTokenRepository, TokenManager
from lmsp_tray.errors import LMSPError
from lmsp_tray.http.api import Api, Scoped
from lmsp_tray.http.app import LMSP
from lmsp_tray.http.problems import EXCEPTION_HANDLERS
from lmsp_tray.http.security import SecurityMiddleware, SecurityPolicy


class OpenAIErrors:
    """OpenAI's error object: {"error": {"message", "type", "code"}}."""

    def _body(self, error: LMSPError) -> bytes:
        return json.dumps({"error": {"message": error.detail, "type": error.code, "code": error.code}}).encode()

    def encode(self, error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        body = self._body(error)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        return error.status, headers + [(k.lower().encode(), v.encode()) for k, v in error.headers.items()], body

    def response(self, error: LMSPError) -> Response:
        return Response(self._body(error), error.status, headers=error.headers, media_type="application/json")


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": []})


V1 = Api("/v1", [Scoped("/models", models, GET="models:read")], errors=OpenAIErrors())


def test_each_api_answers_with_its_own_scopes_and_error_shape() -> None:
    tokens = TokenManager(MemoryTokenRepository(), MemoryVault())
    reader = tokens.create("reader", ["models:read"]).secret
    writer = tokens.create("writer", ["responses:create"]).secret
    apis = [LMSP, V1]
    app = Starlette(routes=[r for api in apis for r in api.starlette_routes()], exception_handlers=EXCEPTION_HANDLERS)
    app.state.apis = apis
    secured = SecurityMiddleware(app, tokens=tokens, policy=SecurityPolicy.build([], 1 << 20), apis=apis)

    async def calls() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=secured)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            bearer = {"reader": {"Authorization": f"Bearer {reader}"}, "writer": {"Authorization": f"Bearer {writer}"}}
            return {
                "v1 no token": await c.get("/v1/models"),
                "v1 reader": await c.get("/v1/models", headers=bearer["reader"]),
                "v1 writer": await c.get("/v1/models", headers=bearer["writer"]),
                "v1 unknown path": await c.get("/v1/nothing", headers=bearer["reader"]),
                "lmsp no token": await c.get("/lmsp/v1/models"),
            }

    got = asyncio.run(calls())
    assert got["v1 reader"].status_code == 200 and got["v1 reader"].json() == {"object": "list", "data": []}
    no_token = got["v1 no token"]
    assert no_token.status_code == 401 and no_token.json()["error"]["code"] == "unauthorized"
    assert no_token.headers["www-authenticate"] == 'Bearer realm="lmsp"'
    lacking = got["v1 writer"]
    assert lacking.status_code == 403 and lacking.json()["error"]["code"] == "insufficient_scope"
    assert lacking.headers["www-authenticate"] == 'Bearer error="insufficient_scope", scope="models:read"'
    assert got["v1 unknown path"].status_code == 404 and got["v1 unknown path"].json()["error"]["code"] == "not_found"
    lmsp = got["lmsp no token"]
    assert lmsp.status_code == 401 and lmsp.headers["content-type"] == "application/problem+json"
    assert lmsp.json()["code"] == "unauthorized"
    assert V1.endpoints() == [("GET", "/v1/models", "models:read")]
