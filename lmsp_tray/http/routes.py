"""The LMSP endpoints: thin handlers that parse, call the service, and shape the answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lmsp_tray.errors import InvalidJSON, InvalidRequest, PayloadTooLarge
from lmsp_tray.http import wire_json
from lmsp_tray.http.security import token_of
from lmsp_tray.http.sse import EventStream, wait_disconnect
from lmsp_tray.protocol.requests import parse_response_create
from lmsp_tray.serving.replay import ANONYMOUS, Caller, iterate
from lmsp_tray.serving.responder import Replayed, Responder
from lmsp_tray.serving.service import Service

MAX_JSON_DEPTH = 64


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return wire_json.dumpb(content)


def _service(request: Request) -> Service:
    return request.app.state.service


def caller_of(request: Request) -> Caller:
    """Who is asking: the token the security middleware authorized (`security.token_of`).

    Idempotency keys are scoped to its id, and the responses and tasks it creates are owned by it
    (another token gets 404 for them). Without a token (no security layer in front): "anonymous",
    no owner. This is the one place to change that policy.
    """
    token = token_of(request)
    if token is None:
        return ANONYMOUS
    token_id = token if isinstance(token, str) else str(token.id)
    return Caller(scope=token_id, owner=token_id)


def idempotency_key(request: Request) -> str | None:
    return request.headers.get("idempotency-key")


REPLAYED = {"Idempotent-Replayed": "true"}


async def read_json(request: Request) -> Any:
    """The request body as JSON, refusing oversized bodies while reading and deep nesting."""
    limit = _service(request).config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise InvalidJSON("The request body is empty; send a JSON object.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJSON("The request body is not valid UTF-8.") from None
    if _nesting(text) > MAX_JSON_DEPTH:
        raise InvalidRequest(f"The JSON body is nested deeper than {MAX_JSON_DEPTH} levels.")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "too deeply nested"
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise InvalidJSON(f"The request body is not valid JSON: {detail}{where}.") from None


def _nesting(text: str) -> int:
    """Maximum bracket depth outside strings (cheap guard before json.loads recursion)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0
    depth = best = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


async def service_document(request: Request) -> Response:
    return JSON(_service(request).service_document())


async def list_models(request: Request) -> Response:
    service = _service(request)
    listing: dict[str, Any] = {"object": "list", "data": service.list_models()}
    incomplete = service.incomplete_files()
    if incomplete:  # files that are not models yet, apart from the list (this service's extension)
        listing["extensions"] = {"lmsp_tray": {"incomplete_files": incomplete}}
    return JSON(listing)


async def get_model(request: Request) -> Response:
    return JSON(_service(request).get_model(request.path_params["model_id"]))


async def load_model(request: Request) -> Response:
    return JSON(await _service(request).load_model(request.path_params["model_id"]))


async def unload_model(request: Request) -> Response:
    return JSON(await _service(request).unload_model(request.path_params["model_id"]))


async def create_response(request: Request) -> Response | EventStream:
    responder: Responder = request.app.state.responder
    body = await read_json(request)
    parsed = parse_response_create(body)
    run = await responder.start(parsed, caller=caller_of(request), key=idempotency_key(request))
    if isinstance(run, Replayed):
        if run.events is not None:
            return EventStream(iterate(run.events), headers={"LMSP-Version": "1.0", **REPLAYED})
        return JSON(run.body, status_code=run.status, headers=REPLAYED)
    if parsed.stream:
        return EventStream(run.events(), on_disconnect=run.cancel, headers={"LMSP-Version": "1.0"})
    result = asyncio.ensure_future(run.result())
    gone = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            run.cancel()  # client left: stop generating now
        return JSON(await result)
    finally:
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone


ROUTES = [
    Route("/lmsp/v1", service_document, methods=["GET"]),
    Route("/lmsp/v1/", service_document, methods=["GET"]),
    Route("/lmsp/v1/models", list_models, methods=["GET"]),
    Route("/lmsp/v1/models/{model_id:path}/load", load_model, methods=["POST"]),
    Route("/lmsp/v1/models/{model_id:path}/unload", unload_model, methods=["POST"]),
    Route("/lmsp/v1/models/{model_id:path}", get_model, methods=["GET"]),
    Route("/lmsp/v1/responses", create_response, methods=["POST"]),
]
