"""Anthropic's error object for `/v1/messages`: what Anthropic's SDKs and Claude Code parse.

Why: those clients pick their exception class from the HTTP status
(`NotFoundError`, `AuthenticationError`, `RateLimitError`, …) and show
`error.message` to the person; `error.type` names the kind
(`invalid_request_error`, `authentication_error`, `not_found_error`,
`rate_limit_error`, `overloaded_error`, `api_error`). The service's typed
errors carry all of that; this shape only writes them as Anthropic does.
"""

from __future__ import annotations

from lmsp_tray.errors import LMSPError
from lmsp_tray.http import wire_json
from lmsp_tray.http.openai.errors import OpenAIErrors
from lmsp_tray.protocol.anthropic_events import anthropic_error


class AnthropicErrors(OpenAIErrors):
    """The `ErrorShape` of the Anthropic routes (see `lmsp_tray.http.api`): OpenAI's JSON answer with
    Anthropic's body."""

    def _body(self, error: LMSPError) -> bytes:
        return wire_json.dumpb(anthropic_error(error.status, error.detail))


ANTHROPIC_ERRORS = AnthropicErrors()
