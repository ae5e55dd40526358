"""The one place errors become RFC 9457 problem documents.

Typed `LMSPError`s map to their code and status; Starlette's own 404/405
become `not_found`/`method_not_allowed`; anything else is logged here and
answered as a bare `internal_error` — a stack trace never reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import InternalError, LMSPError, MethodNotAllowed, NotFound
from lmsp_tray.http import wire_json

log = logging.getLogger("lmsp_tray.http")

PROBLEM_JSON = "application/problem+json"


def problem_response(error: LMSPError) -> Response:
    headers = {"LMSP-Version": "1.0", **error.headers}
    body = wire_json.dumpb(error.to_problem())
    return Response(body, status_code=error.status, media_type=PROBLEM_JSON, headers=headers)


def problem_bytes(error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, raw headers and body of a problem (for pure ASGI middleware)."""
    body = wire_json.dumpb(error.to_problem())
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"lmsp-version", b"1.0"),
    ] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    return error.status, headers, body


async def send_problem(send: Any, error: LMSPError) -> None:
    status, headers, body = problem_bytes(error)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def lmsp_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LMSPError)
    return problem_response(exc)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        error: LMSPError = MethodNotAllowed(
            f"{request.method} is not allowed on {request.url.path}" + (f"; use {allowed}." if allowed else "."),
            headers={"Allow": allowed} if allowed else None,
        )
    elif exc.status_code == 404:
        error = NotFound(f"There is nothing at {request.url.path}. The API lives under /lmsp/v1.")
    else:
        error = LMSPError(str(exc.detail))
        error.status, error.code, error.title = exc.status_code, "http_error", "HTTP error"
    return problem_response(error)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(InternalError("The service hit an unexpected error; it has been logged."))


EXCEPTION_HANDLERS = {
    LMSPError: lmsp_error_handler,
    HTTPException: http_exception_handler,
    Exception: unexpected_error_handler,
}
