"""Puts every API request on the activity log (`serving.activity`), for the console's Activity view.

Why pure ASGI, outermost: refused requests (a revoked token's 401, a foreign
origin's 403) belong in the view too, and a stream must pass through
untouched. The row starts before anything else runs and is the current row
while the request is handled, so a response generated for it adds its model
figures to the same row; the status is set when the status line goes out
and the row is done once the last byte is sent (or the client left). Only
the path is recorded, never headers, query strings or bodies. The
console's own polling of ``GET /lmsp/v1/activity`` and the page's static
files are not recorded.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.security import STATE_KEYLESS, STATE_TOKEN
from lmsp_tray.serving.activity import ActivityLog

KEYLESS_APP = "(no token)"  # who asked, for a request let in by keyless_scopes

QUIET_PATHS = ("/lmsp/v1/activity", "/console")


class ActivityRecorder:
    def __init__(self, app: Any, activity: ActivityLog) -> None:
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        if scope["type"] != "http" or path.startswith(QUIET_PATHS) or not path.startswith("/lmsp/"):
            await self.app(scope, receive, send)
            return
        activity = self.activity
        entry, context = activity.begin(scope["method"], path, None)
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
                activity.end(entry, status)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            if not entry.done:
                activity.end(entry, status)  # the client left, or the app raised
            activity.reset(context)


def _model_of(path: str) -> str | None:
    """The model id in `/lmsp/v1/models/{id}[/load|/unload]`, if the path is one of those."""
    prefix = "/lmsp/v1/models/"
    if not path.startswith(prefix) or len(path) == len(prefix):
        return None
    rest = path[len(prefix) :]
    for suffix in ("/load", "/unload"):
        if rest.endswith(suffix):
            return rest[: -len(suffix)] or None
    return rest
