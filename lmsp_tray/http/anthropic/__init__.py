"""Anthropic's Messages API: what Claude Code and Anthropic's SDKs speak.

Why a package of its own: `POST /v1/messages` runs the same engine,
scheduler, tokens, scopes and Host/Origin/size checks as `/v1`, but answers
with Anthropic's shapes and Anthropic's error object. Its routes share the
`/v1` prefix with OpenAI's, so `ANTHROPIC` claims only its own paths
(`AnthropicApi`) and is mounted before `/v1`:

- `messages.py`: `POST /v1/messages`, `POST /v1/messages/count_tokens` (`responses:create`)
- `models.py`: `GET /v1/models` in Anthropic's shape for a request with `anthropic-version`
- `errors.py`: `{"type": "error", "error": {"type", "message"}}`

Keys: `x-api-key: <token>` (Anthropic's SDKs) and `Authorization: Bearer
<token>` (Claude Code with `ANTHROPIC_AUTH_TOKEN`) both work (`security.bearer`).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from starlette.routing import BaseRoute, Match

from lmsp_tray.http.anthropic.errors import ANTHROPIC_ERRORS
from lmsp_tray.http.anthropic.messages import MESSAGE_ROUTES
from lmsp_tray.http.api import Api, Scoped


class _Answered(Scoped):
    """A route that claims its path for every method, so another method is its 405 rather than a 404 of
    the API mounted after it."""

    def matches(self, scope: Any) -> tuple[Match, MutableMapping[str, Any]]:
        match, child = super().matches(scope)
        return (Match.FULL if match is Match.PARTIAL else match), child


class AnthropicApi(Api):
    """An `Api` whose routes live under a prefix another API also uses: it owns only its routes' paths,
    and mounts them as plain routes (placed before the other API's mount)."""

    def starlette_routes(self) -> list[BaseRoute]:
        return [_Answered(self.prefix + r.path, r.endpoint, **r.scopes) for r in self.routes]

    def owns(self, path: str) -> bool:
        return any(path == self.prefix + r.path for r in self.routes)


ANTHROPIC = AnthropicApi("/v1", MESSAGE_ROUTES, errors=ANTHROPIC_ERRORS)
