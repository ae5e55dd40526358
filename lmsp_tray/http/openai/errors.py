"""OpenAI's error object for `/v1`: what the OpenAI SDKs and the apps built on them parse.

Why: those clients read `error.message` (shown to the person), pick their
exception class from the HTTP status (NotFoundError, RateLimitError, …) and
some branch on `error.code` (`model_not_found`, `context_length_exceeded`).
The service's typed errors (`lmsp_tray.errors`) carry all of that; this shape
only writes them the way OpenAI does, never a traceback.
"""

from __future__ import annotations

from starlette.responses import Response

from lmsp_tray.errors import LMSPError
from lmsp_tray.http import wire_json
from lmsp_tray.protocol.openai_chunks import error_type  # OpenAI's `type` by HTTP status

__all__ = ["OPENAI_ERRORS", "OpenAIErrors", "error_body", "error_type"]


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
        return wire_json.dumpb(error_body(error))

    def encode(self, error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        body = self._body(error)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        return error.status, headers + [(k.lower().encode(), v.encode()) for k, v in error.headers.items()], body

    def response(self, error: LMSPError) -> Response:
        return Response(self._body(error), error.status, headers=error.headers, media_type="application/json")


OPENAI_ERRORS = OpenAIErrors()
