"""The one place errors become RFC 9457 problem documents, the error shape of `/lmsp/v1`.

Typed `LMSPError`s map to their code and status; Starlette's own 404/405
become `not_found`/`method_not_allowed`; anything else is logged here and
answered as a bare `internal_error` — a stack trace never reaches a client.
The exception handlers answer in the error shape of the API a request is
for (`api.Api.errors`); `LMSP-Version` is added by the version middleware,
to these answers as to every other.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from lmsp_tray.errors import InsufficientStorage, InternalError, LMSPError, MethodNotAllowed, NotFound, quote
from lmsp_tray.http import wire_json
from lmsp_tray.http.api import ErrorShape, api_for

log = logging.getLogger("lmsp_tray.http")

PROBLEM_JSON = "application/problem+json"


class ProblemDocuments:
    """LMSP's error shape: `application/problem+json` with the error's code, status and headers."""

    def encode(self, error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        body = wire_json.dumpb(error.to_problem())
        headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            (b"content-length", str(len(body)).encode()),
        ] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
        return error.status, headers, body

    def response(self, error: LMSPError) -> Response:
        body = wire_json.dumpb(error.to_problem())
        return Response(body, status_code=error.status, media_type=PROBLEM_JSON, headers=dict(error.headers))


PROBLEMS = ProblemDocuments()


async def send_error(send: Any, error: LMSPError, shape: ErrorShape = PROBLEMS) -> None:
    """Answer with `error` from pure ASGI code (middleware), in the given error shape."""
    status, headers, body = shape.encode(error)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _shape(request: Request) -> ErrorShape:
    apis = getattr(request.app.state, "apis", None)
    return api_for(apis, request.url.path).errors if apis else PROBLEMS


async def lmsp_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LMSPError)
    return _shape(request).response(exc)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        error: LMSPError = MethodNotAllowed(
            f"{quote(request.method)} is not allowed on {quote(request.url.path)}"
            + (f"; use {allowed}." if allowed else "."),
            headers={"Allow": allowed} if allowed else None,
        )
    elif exc.status_code == 404:
        error = NotFound(f"There is nothing at {quote(request.url.path)}. The API lives under /lmsp/v1.")
    else:
        error = LMSPError(str(exc.detail))
        error.status, error.code, error.title = exc.status_code, "http_error", "HTTP error"
    return _shape(request).response(error)


async def os_error_handler(request: Request, exc: Exception) -> Response:
    """A full disk, wherever it was met (the store's own `StorageFull` is one too): 507, not 500."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        log.error("disk full on %s %s: %s", request.method, quote(request.url.path), exc)
        full = InsufficientStorage("The disk is full, so this change was not saved. Free some disk space and retry.")
        return _shape(request).response(full)
    return await unexpected_error_handler(request, exc)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    log.error("unexpected error on %s %s", request.method, quote(request.url.path), exc_info=exc)
    return _shape(request).response(InternalError("The service hit an unexpected error; it has been logged."))


async def client_gone_handler(request: Request, exc: Exception) -> Response:
    """The client went away (or its connection was closed for a late body): nobody reads an answer."""
    log.info("client left during %s %s", request.method, quote(request.url.path))
    return Response(status_code=400)


EXCEPTION_HANDLERS = {
    ClientDisconnect: client_gone_handler,
    OSError: os_error_handler,
    LMSPError: lmsp_error_handler,
    HTTPException: http_exception_handler,
    Exception: unexpected_error_handler,
}
