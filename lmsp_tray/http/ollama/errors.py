"""Ollama's error shape for `/api/…`: `{"error": "…"}` with the status Ollama would answer.

Why: Ollama's clients raise `ResponseError(error, status_code)` from that one field,
and the apps built on them show it to the person. The service's typed errors carry
the status and the text; this shape writes them Ollama's way. A refused request
without a token says what to change: Ollama's clients and most apps built on them
send no key, so the 401 names the `keyless_scopes` setting and where it is set.
"""

from __future__ import annotations

from starlette.responses import Response

from lmsp_tray.errors import LMSPError
from lmsp_tray.http import wire_json

KEYLESS_HINT = (
    " Ollama's apps usually send no key: to serve them without one, tick what they may do under "
    "'Apps without a token' in the console's Settings (or set keyless_scopes = [\"models:read\", "
    '"responses:create"] in config.toml); or give the app a token as `Authorization: Bearer <token>`.'
)


def error_text(error: LMSPError) -> str:
    """The `error` text: the error's own, and for a refused request without a valid token, how to let it in."""
    return error.detail + (KEYLESS_HINT if error.status == 401 else "")


class OllamaErrors:
    """The `ErrorShape` of the Ollama API (see `lmsp_tray.http.api`)."""

    def _body(self, error: LMSPError) -> bytes:
        return wire_json.dumpb({"error": error_text(error)})

    def encode(self, error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        body = self._body(error)
        headers = [(b"content-type", b"application/json; charset=utf-8"), (b"content-length", str(len(body)).encode())]
        return error.status, headers + [(k.lower().encode(), v.encode()) for k, v in error.headers.items()], body

    def response(self, error: LMSPError) -> Response:
        return Response(self._body(error), error.status, headers=error.headers, media_type="application/json")


OLLAMA_ERRORS = OllamaErrors()
