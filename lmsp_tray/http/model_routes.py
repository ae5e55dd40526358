"""Managing models beyond loading them: `PATCH /lmsp/v1/models/{id}/settings` (a model's own settings)
`DELETE /lmsp/v1/models/{id}` (only files the service owns: `serving.model_removal`), and the search
of Hugging Face the console's Discover view uses (`GET /hub/models`, `GET /hub/variants`: `hub.search`).

Thin handlers like the others: the body is read and handed to the serving layer
(`serving.model_settings`), which checks it by config.toml's rules, writes the file and applies
it; the answer is the model object, its settings shown under ``extensions.lmsp_tray.settings``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import InvalidRequest, ServiceUnavailable
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, get_model, read_json
from lmsp_tray.hub.search import HubSearch
from lmsp_tray.serving.model_removal import ModelRemover
from lmsp_tray.serving.model_settings import ModelSettingsEditor
from lmsp_tray.serving.service import Service


@dataclass(frozen=True)
class ModelParts:
    """What the model management endpoints use, given by the daemon (`create_app(models=…)`)."""

    settings: ModelSettingsEditor | None = None
    remover: ModelRemover | None = None
    search: HubSearch | None = None


def _parts(request: Request) -> ModelParts:
    return getattr(request.app.state, "model_parts", None) or ModelParts()


async def model_settings(request: Request) -> Response:
    service: Service = request.app.state.service
    editor = _parts(request).settings
    if editor is None:
        raise ServiceUnavailable("This service runs without a settings file; model settings cannot be changed.")
    entry = service.entry(request.path_params["model_id"])
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest('Send a JSON object of settings to change, e.g. {"temperature": 0.2}.')
    await asyncio.to_thread(editor.update, entry.id, body)
    return JSON(service.get_model(entry.id))


async def delete_model(request: Request) -> Response:
    service: Service = request.app.state.service
    remover = _parts(request).remover
    if remover is None:
        raise ServiceUnavailable("This service cannot delete models (it runs without its data folder).")
    entry = service.entry(request.path_params["model_id"])
    force = request.query_params.get("force", "false").lower()
    if force not in ("true", "false", "1", "0"):
        raise InvalidRequest("force must be true or false.", param="force")
    removed = await asyncio.to_thread(remover.remove, entry, force=force in ("true", "1"))
    return JSON(removed.to_json())


def _search(request: Request) -> HubSearch:
    search = _parts(request).search
    if search is None:
        raise ServiceUnavailable("This service cannot search Hugging Face (it runs without downloads).")
    return search


async def search_hub(request: Request) -> Response:
    """`GET /hub/models?search=…`: GGUF repositories on Hugging Face (cached briefly)."""
    text = request.query_params.get("search", "").strip()
    if not text or len(text) > 200:
        raise InvalidRequest("Send search=<words> (1 to 200 characters), e.g. ?search=gemma.", param="search")
    found = await asyncio.to_thread(_search(request).search, text)
    return JSON({"object": "list", "data": found})


async def hub_variants(request: Request) -> Response:
    """`GET /hub/variants?repository=org/repo`: its GGUF variants, sizes, fit on this machine, projector."""
    repo = request.query_params.get("repository", "").strip()
    if repo.count("/") != 1 or len(repo) > 200:
        raise InvalidRequest("Send repository=<org>/<name>, as the search lists it.", param="repository")
    return JSON(await asyncio.to_thread(_search(request).variants, repo))


async def model(request: Request) -> Response:
    """`/models/{id}`: GET reads it (`routes.get_model`), DELETE deletes it; one route, so a 405 lists both."""
    return await (delete_model(request) if request.method == "DELETE" else get_model(request))


# Under /lmsp/v1, after LMSP's `ROUTES` (their `/models/{id}/load|unload` first: a path ending in
# `{model_id:path}` would take them), the more specific first.
MODEL_ROUTES = [
    Scoped("/models/{model_id:path}/settings", model_settings, PATCH="models:manage"),
    Scoped("/models/{model_id:path}", model, GET="models:read", DELETE="models:manage"),
    Scoped("/hub/models", search_hub, GET="models:manage"),
    Scoped("/hub/variants", hub_variants, GET="models:manage"),
]
