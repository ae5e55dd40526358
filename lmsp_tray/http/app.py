"""The Starlette application: the `/lmsp/v1` API and the console page, security, the LMSP-Version rule and
problem documents."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette

from lmsp_tray.auth.console import ConsoleAccess
from lmsp_tray.auth.pairing import Auth
from lmsp_tray.errors import UnsupportedVersion
from lmsp_tray.http.anthropic import ANTHROPIC
from lmsp_tray.http.api import Api, api_for
from lmsp_tray.http.auth_routes import AUTH_ROUTES
from lmsp_tray.http.body_parser import BodyParser
from lmsp_tray.http.console_routes import (
    CONSOLE_API_ROUTES,
    CONSOLE_PAGE_ROUTES,
    ConsoleParts,
    console_redirect,
    load_assets,
)
from lmsp_tray.http.download_routes import DOWNLOAD_ROUTES
from lmsp_tray.http.metrics_routes import METRICS, METRICS_PATHS
from lmsp_tray.http.model_routes import MODEL_ROUTES, ModelParts
from lmsp_tray.http.ollama import OLLAMA
from lmsp_tray.http.openai import OPENAI, OPENAI_ROOT
from lmsp_tray.http.problems import EXCEPTION_HANDLERS, PROBLEMS, send_error
from lmsp_tray.http.recorder import ActivityRecorder
from lmsp_tray.http.routes import ROUTES
from lmsp_tray.http.security import SecurityMiddleware, SecurityPolicy
from lmsp_tray.http.stored_routes import STORED_ROUTES
from lmsp_tray.http.tokenize_routes import TOKENIZE_ROUTES
from lmsp_tray.serving.responder import Responder
from lmsp_tray.serving.service import Service

LMSP = Api(
    "/lmsp/v1",
    [*DOWNLOAD_ROUTES, *TOKENIZE_ROUTES, *ROUTES, *MODEL_ROUTES, *STORED_ROUTES, *AUTH_ROUTES, *CONSOLE_API_ROUTES],
    errors=PROBLEMS,
)
CONSOLE = Api("/console", CONSOLE_PAGE_ROUTES, errors=PROBLEMS, bare=console_redirect)  # the page's files
APIS = [
    LMSP,
    CONSOLE,
    ANTHROPIC,
    OPENAI,
    OPENAI_ROOT,
    METRICS,
    OLLAMA,
]  # the first also answers for paths outside every API; /v1/messages before /v1


class VersionHeader:
    """Every response carries `LMSP-Version: 1.0`: the routes', the errors', the security layer's own."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"lmsp-version" for k, _ in headers):
                    headers.append((b"lmsp-version", b"1.0"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_version)


class VersionCheck:
    """A request for another major version of LMSP gets 400 (after the security checks)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"lmsp-version" and value.decode("latin-1").strip().split(".", 1)[0] != "1":
                    detail = f"LMSP-Version {value.decode('latin-1')!r} is not supported; this service speaks 1.0."
                    await send_error(send, UnsupportedVersion(detail, param="LMSP-Version"))
                    return
        await self.app(scope, receive, send)


def create_app(
    service: Service,
    auth: Auth,
    *,
    responder: Responder | None = None,
    conversations: Any = None,
    tasks: Any = None,
    downloads: Any = None,
    console: ConsoleParts | None = None,
    models: ModelParts | None = None,
    bodies: BodyParser | None = None,
) -> Any:
    """The ASGI app: the activity recorder (when there is an activity log), security checks (Host,
    Origin, token), the version rule, then the routes: the API and the console page.

    The daemon passes `responder`, `conversations` and `tasks` (built over the store); without them
    `store` and `Idempotency-Key` are ignored and the stored-response and task endpoints answer 503.
    It also passes `console` (the code exchange, activity log, settings); without it the console's
    code exchange still works but its activity and settings endpoints answer 503. And `bodies`, the worker
    process for big bodies, which it closes when it stops (without it the app starts its own, ended at exit)."""
    routes = [route for api in APIS for route in api.starlette_routes()]
    app = Starlette(routes=routes, exception_handlers=dict(EXCEPTION_HANDLERS))
    app.state.apis = APIS
    app.state.service = service
    app.state.auth = auth
    app.state.responder = responder or Responder(service)
    app.state.conversations = conversations
    app.state.tasks = tasks
    app.state.downloads = downloads
    app.state.console = console or ConsoleParts(ConsoleAccess(auth.tokens))
    app.state.console_assets = load_assets()
    app.state.model_parts = models or ModelParts()
    app.state.large_bodies = asyncio.Semaphore(1)  # large bodies are decoded one at a time (routes.off_loop)
    app.state.bodies = bodies or BodyParser()  # big bodies are parsed in a worker process (routes.read_parsed)
    policy = SecurityPolicy.build(service.config.allowed_origins, service.config.max_request_bytes)
    answered = VersionHeader(
        SecurityMiddleware(
            VersionCheck(app),
            tokens=auth.tokens,
            policy=policy,
            apis=APIS,
            keyless=lambda: service.config.keyless_scopes,  # the settings in effect (they change live)
            keyless_paths=lambda: METRICS_PATHS if service.config.metrics_keyless else (),
        )
    )
    activity = app.state.console.activity
    return answered if activity is None else ActivityRecorder(answered, activity, route_of)


def route_of(method: str, path: str) -> str | None:
    """The path pattern of the route serving `method path` (e.g. `/v1/responses/{response_id}`), if any."""
    api = api_for(APIS, path)
    route = api.route_for(method, path)
    return None if route is None else api.prefix + route.path
