"""The console: its page (static files from the package) and the API endpoints only it needs so far.

Why a module of its own: the page under ``/console/`` is not part of the LMSP
API, and its endpoints talk to parts the model routes do not (the console's
code exchange, the activity log, the settings file, the desktop).

- ``GET /console/`` and its assets: public files read once from the
  package's ``console/`` folder, each answered with a strict
  Content-Security-Policy (scripts, styles and connections from this origin
  only, no inline script), ``frame-ancestors 'none'`` and
  ``X-Frame-Options: DENY``, ``nosniff``, no referrer, and same-origin
  opener and resource policies. No CORS header is ever added for them.
- ``POST /lmsp/v1/console/sessions`` (public; the single-use code is the
  credential): exchange a code for the console token (`auth.console`).
- ``POST /lmsp/v1/console/codes`` (``tokens:manage``): a console link for
  ``lmsp-tray open``, whose URL carries the code in its fragment.
- ``GET /lmsp/v1/activity`` (``activity:read``), ``GET|PATCH
  /lmsp/v1/settings`` (``settings:manage``), ``POST
  /lmsp/v1/console/reveal`` (``models:manage``: show a model's folder in the
  file manager), ``GET /lmsp/v1/responses/{id}/input_items``
  (``responses:read``: a stored turn's input, as in OpenAI's API).
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from lmsp_tray.auth.console import ConsoleAccess
from lmsp_tray.errors import Conflict, InvalidRequest, ServiceUnavailable
from lmsp_tray.http.api import PUBLIC, Scoped
from lmsp_tray.http.routes import JSON, caller_of, read_json
from lmsp_tray.serving.activity import ActivityLog
from lmsp_tray.serving.settings import Settings

CONSOLE_PATH = "/console/"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src data:; "
    "connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
NO_STORE = {"Cache-Control": "no-store"}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


@dataclass(frozen=True)
class ConsoleParts:
    """What the console endpoints use, given by the daemon (`create_app(console=…)`)."""

    access: ConsoleAccess
    activity: ActivityLog | None = None
    settings: Settings | None = None
    reveal: Callable[[Path], object] | None = None  # show a folder in the file manager (desktop only)
    store_bytes: Callable[[], int] | None = None  # the database's size on disk (for /metrics)


def load_assets() -> dict[str, Asset]:
    """Every file of the package's `console/` folder, by its path under /console/ ("" is the page)."""
    root = resources.files("lmsp_tray").joinpath("console")
    assets: dict[str, Asset] = {}

    def walk(folder: Any, prefix: str) -> None:
        for item in folder.iterdir():
            if item.name.startswith("."):
                continue
            if item.is_dir():
                walk(item, f"{prefix}{item.name}/")
                continue
            body = item.read_bytes()
            media = mimetypes.guess_type(item.name)[0] or "application/octet-stream"
            if media.startswith("text/") or media in ("application/javascript", "image/svg+xml"):
                media += "; charset=utf-8"
            if item.name.endswith(".js"):
                media = "text/javascript; charset=utf-8"
            assets[prefix + item.name] = Asset(body, media, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')

    if root.is_dir():
        walk(root, "")
    if "index.html" in assets:
        assets[""] = assets["index.html"]
    return assets


def _parts(request: Request) -> ConsoleParts:
    return request.app.state.console


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


# -- the page -------------------------------------------------------------------------------------
async def console_redirect(request: Request) -> Response:
    return RedirectResponse(CONSOLE_PATH, status_code=308, headers=PAGE_HEADERS)


async def console_file(request: Request) -> Response:
    name = request.path_params.get("name", "")
    asset = request.app.state.console_assets.get(name)
    if asset is None:
        return Response("Not found.\n", status_code=404, media_type="text/plain", headers={**PAGE_HEADERS, **NO_STORE})
    headers = {**PAGE_HEADERS, "Cache-Control": "no-cache", "ETag": asset.etag}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    body = b"" if request.method == "HEAD" else asset.body
    return Response(body, media_type=asset.media_type, headers=headers)


# -- the code exchange ----------------------------------------------------------------------------
async def create_session(request: Request) -> Response:
    body = _object(await read_json(request))
    session = await asyncio.to_thread(_parts(request).access.exchange, body.get("code"))
    doc = {
        "object": "console.session",
        "token": session.secret,
        "token_id": session.token.id,
        "name": session.token.name,
        "scopes": list(session.token.scopes),
    }
    return JSON(doc, status_code=201, headers=NO_STORE)


async def create_code(request: Request) -> Response:
    code = _parts(request).access.issue_code()
    host = request.headers.get("host", "127.0.0.1")
    doc = {
        "object": "console.link",
        "url": f"http://{host}{CONSOLE_PATH}#code={code.code}",
        "expires_at": int(code.expires_at),
    }
    return JSON(doc, status_code=201, headers=NO_STORE)


# -- activity, settings, the desktop --------------------------------------------------------------
async def activity(request: Request) -> Response:
    log = _parts(request).activity
    if log is None:
        raise ServiceUnavailable("This service runs without an activity log.")
    after = request.query_params.get("after", "0")
    if not after.isdigit() or len(after) > 15:
        raise InvalidRequest("'after' must be a whole number (the 'cursor' of the last answer).", param="after")
    return JSON(log.snapshot(int(after)), headers=NO_STORE)


def _settings(request: Request) -> Settings:
    settings = _parts(request).settings
    if settings is None:
        raise ServiceUnavailable("This service runs without a settings file.")
    return settings


async def settings(request: Request) -> Response:
    if request.method == "PATCH":
        body = _object(await read_json(request))
        return JSON(await asyncio.to_thread(_settings(request).update, body), headers=NO_STORE)
    return JSON(await asyncio.to_thread(_settings(request).document), headers=NO_STORE)


async def reveal(request: Request) -> Response:
    body = _object(await read_json(request))
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidRequest("Say which model's folder to show: 'model'.", param="model")
    entry = request.app.state.service.entry(model, param="model")
    opener = _parts(request).reveal
    if opener is None:
        raise Conflict(f"The service runs without a desktop to show it; the folder is {entry.path.parent}.")
    try:
        await asyncio.to_thread(opener, entry.path.parent)
    except OSError as exc:
        raise ServiceUnavailable(f"Could not open {entry.path.parent}: {exc}") from None
    return JSON({"object": "console.reveal", "model": entry.id, "folder": str(entry.path.parent)})


async def input_items(request: Request) -> Response:
    rid = request.path_params["response_id"]
    conversations = request.app.state.conversations
    if conversations is None:
        raise ServiceUnavailable("This service runs without its store; stored responses are not available.")
    items = await conversations.input_items(rid, owner=caller_of(request).owner)
    data = [{**item, "id": item.get("id") or f"{rid}_in_{i}"} for i, item in enumerate(items)]
    return JSON(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": False,
        }
    )


# Under /lmsp/v1, each with the scope each method needs.
CONSOLE_API_ROUTES = [
    Scoped("/console/sessions", create_session, POST=PUBLIC),  # needs a single-use console code instead
    Scoped("/console/codes", create_code, POST="tokens:manage"),  # a console code leads to a token
    Scoped("/console/reveal", reveal, POST="models:manage"),
    Scoped("/activity", activity, GET="activity:read"),
    Scoped("/settings", settings, GET="settings:manage", PATCH="settings:manage"),
    Scoped("/responses/{response_id}/input_items", input_items, GET="responses:read"),
]
# Under /console (`/console` itself redirects to `/console/`): the page's static files, which anyone on
# the machine may fetch; its API calls carry its token.
CONSOLE_PAGE_ROUTES = [Scoped("/{name:path}", console_file, GET=PUBLIC)]
