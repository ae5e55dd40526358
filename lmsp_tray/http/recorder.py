"""Puts every API request on the activity log (`serving.activity`), for the console's Activity view.

Why pure ASGI, outermost: refused requests (a revoked token's 401, a foreign
origin's 403) belong in the view too, and a stream must pass through
untouched. The row starts before anything else runs and is the current row
while the request is handled, so a response generated for it adds its model
figures to the same row; the status is set when the status line goes out
and the row is done once the last byte is sent (or the client left). Only
the path is recorded, never headers, query strings or bodies. Every API is
recorded (`/lmsp/v1`, `/v1`, Ollama's `/api`, `/rerank`), so a `/v1` answer's
figures land on its own row rather than one of their own. The console's own
polling of ``GET /lmsp/v1/activity``, the page's static files and
Prometheus's scrapes of ``GET /metrics`` are not recorded. The log's running
totals count each request under the path pattern of the route it matched
(`route_of`), so that response and model ids do not each become a series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmsp_tray.http.security import STATE_KEYLESS, STATE_TOKEN
from lmsp_tray.serving.activity import ActivityLog

KEYLESS_APP = "(no token)"  # who asked, for a request let in by keyless_scopes

QUIET_PATHS = ("/lmsp/v1/activity", "/console", "/metrics")
UNMATCHED = "(no route)"
MAX_SHOWN_PATH = (
    300  # characters of a path kept on its row  # the totals' route label of a path no route serves (a 404)
)


class ActivityRecorder:
    def __init__(
        self, app: Any, activity: ActivityLog, route_of: Callable[[str, str], str | None] = lambda m, p: p
    ) -> None:
        self.app = app
        self.activity = activity
        self.route_of = route_of  # (method, path) -> the matched route's path pattern, or None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        if scope["type"] != "http" or path.startswith(QUIET_PATHS):
            await self.app(scope, receive, send)
            return
        activity = self.activity
        shown = path if len(path) <= MAX_SHOWN_PATH else path[:MAX_SHOWN_PATH] + "…"  # a 100 kB URL: refused, 414
        entry, context = activity.begin(scope["method"], shown, None)
        route = self.route_of(scope["method"], path) or UNMATCHED
        model = _model_of(path)
        if model:
            activity.note_model(model)
        status: int | None = None

        async def recording_send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                state = scope.get("state", {})
                token = state.get(STATE_TOKEN)
                app = getattr(token, "name", None) or (KEYLESS_APP if state.get(STATE_KEYLESS) else None)
                activity.status(entry, status, app)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                activity.end(entry, status, route)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            if not entry.done:
                activity.end(entry, status, route)  # the client left, or the app raised
            activity.reset(context)


def _model_of(path: str) -> str | None:
    """The model id in `/lmsp/v1/models/{id}[/load|/unload|/tokenize|...]`, if the path is one of those."""
    prefix = "/lmsp/v1/models/"
    if not path.startswith(prefix) or len(path) == len(prefix):
        return None
    rest = path[len(prefix) :]
    for suffix in ("/load", "/unload", "/tokenize", "/detokenize", "/apply-template"):
        if rest.endswith(suffix):
            return rest[: -len(suffix)] or None
    return rest
