"""The Starlette application: routes, security, the LMSP-Version rule and problem documents."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette

from lmsp_tray.auth.console import ConsoleAccess
from lmsp_tray.auth.pairing import Auth
from lmsp_tray.errors import UnsupportedVersion
from lmsp_tray.http.auth_routes import AUTH_ROUTES
from lmsp_tray.http.console_routes import CONSOLE_API_ROUTES, CONSOLE_PAGE_ROUTES, ConsoleParts, load_assets
from lmsp_tray.http.download_routes import DOWNLOAD_ROUTES
from lmsp_tray.http.problems import EXCEPTION_HANDLERS, send_problem
from lmsp_tray.http.recorder import ActivityRecorder
from lmsp_tray.http.routes import ROUTES
from lmsp_tray.http.security import SecurityMiddleware, SecurityPolicy
from lmsp_tray.http.stored_routes import STORED_ROUTES
from lmsp_tray.serving.responder import Responder
from lmsp_tray.serving.service import Service


class VersionMiddleware:
    """Every response carries `LMSP-Version: 1.0`; a request for another major version gets 400."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"lmsp-version":
                major = value.decode("latin-1").strip().split(".", 1)[0]
                if major != "1":
                    await send_problem(
                        send,
                        UnsupportedVersion(
                            f"LMSP-Version {value.decode('latin-1')!r} is not supported; this service speaks 1.0.",
                            param="LMSP-Version",
                        ),
                    )
                    return

        async def send_with_version(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"lmsp-version" for k, _ in headers):
                    headers.append((b"lmsp-version", b"1.0"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_version)


def all_routes() -> list[Any]:
    """The API's routes (everything under /lmsp/v1)."""
    return [*DOWNLOAD_ROUTES, *ROUTES, *STORED_ROUTES, *AUTH_ROUTES, *CONSOLE_API_ROUTES]


def create_app(
    service: Service,
    auth: Auth,
    *,
    responder: Responder | None = None,
    conversations: Any = None,
    tasks: Any = None,
    downloads: Any = None,
    console: ConsoleParts | None = None,
) -> Any:
    """The ASGI app: the activity recorder (when there is an activity log), security checks (Host,
    Origin, token), the version rule, then the routes: the API and the console page.

    The daemon passes `responder`, `conversations` and `tasks` (built over the store); without them
    `store` and `Idempotency-Key` are ignored and the stored-response and task endpoints answer 503.
    It also passes `console` (the code exchange, activity log, settings); without it the console's
    code exchange still works but its activity and settings endpoints answer 503."""
    routes = [*all_routes(), *CONSOLE_PAGE_ROUTES]
    app = Starlette(routes=routes, exception_handlers=dict(EXCEPTION_HANDLERS))
    app.state.service = service
    app.state.auth = auth
    app.state.responder = responder or Responder(service)
    app.state.conversations = conversations
    app.state.tasks = tasks
    app.state.downloads = downloads
    app.state.console = console or ConsoleParts(ConsoleAccess(auth.tokens))
    app.state.console_assets = load_assets()
    policy = SecurityPolicy.build(service.config.allowed_origins, service.config.max_request_bytes)
    secured = SecurityMiddleware(VersionMiddleware(app), tokens=auth.tokens, policy=policy)
    activity = app.state.console.activity
    return secured if activity is None else ActivityRecorder(secured, activity)
