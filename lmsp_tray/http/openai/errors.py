"""OpenAI's error object for `/v1`: what the OpenAI SDKs and the apps built on them parse.

Why: those clients read `error.message` (shown to the person), pick their
exception class from the HTTP status (NotFoundError, RateLimitError, …) and
some branch on `error.code` (`model_not_found`, `context_length_exceeded`).
The service's typed errors (`lmsp_tray.errors`) carry all of that; this shape
only writes them the way OpenAI does, never a traceback.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from lmsp_tray.errors import LMSPError

# OpenAI's `type` by HTTP status (the SDKs pick their exception class from the status itself).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "server_error")


def error_body(error: LMSPError) -> dict[str, object]:
    """`{"error": {"message", "type", "param", "code"}}` for a service error."""
    return {
        "error": {
            "message": error.detail,
            "type": error_type(error.status),
            "param": error.param,
            "code": error.code,
        }
    }


class OpenAIErrors:
    """The `ErrorShape` of `/v1` (see `lmsp_tray.http.api`)."""

    def _body(self, error: LMSPError) -> bytes:
        return json.dumps(error_body(error), ensure_ascii=False).encode("utf-8")

    def encode(self, error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        body = self._body(error)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        return error.status, headers + [(k.lower().encode(), v.encode()) for k, v in error.headers.items()], body

    def response(self, error: LMSPError) -> Response:
        return Response(self._body(error), error.status, headers=error.headers, media_type="application/json")


OPENAI_ERRORS = OpenAIErrors()
