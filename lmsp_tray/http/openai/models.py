"""`GET /v1/models` and `GET /v1/models/{id}` in OpenAI's shape.

Why: an app pointed at a local base URL first lists the models to fill its
picker; OpenAI's model object is `{"id", "object": "model", "created",
"owned_by"}`. Every model the service found is listed (loaded or not: a request
loads it); an unknown id is 404 `model_not_found`, as OpenAI answers.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.http.anthropic.models import asks_anthropic, model_info, model_page
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON
from lmsp_tray.serving.service import Service


def _service(request: Request) -> Service:
    return request.app.state.service


FILL_IN_THE_MIDDLE = "fill_in_the_middle"
VISION = "vision"  # takes images: the model has a projector with a vision encoder
AUDIO = "audio"  # takes audio: the model has a projector with an audio encoder


def model_object(model: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's model object for one model of the LMSP listing, with two fields of ours beside OpenAI's:
    its context window (as vLLM and LM Studio add theirs) for apps that size their prompts, and its
    capabilities — LMSP's, plus `fill_in_the_middle` for a model that completes with a `suffix` (an
    LMSP extension on `/lmsp/v1`, where the capability names are fixed), so an editor can pick a code
    model for inline completion, `vision` for a model that takes images and `audio` for one that takes
    audio (`input_modalities` on `/lmsp/v1`)."""
    own = (model.get("extensions") or {}).get("lmsp_tray") or {}
    try:
        created = int(os.stat(own["path"]).st_mtime)
    except (KeyError, TypeError, OSError):
        created = 0
    capabilities = list(model.get("capabilities") or [])
    if own.get(FILL_IN_THE_MIDDLE):
        capabilities.append(FILL_IN_THE_MIDDLE)
    if "image" in (own.get("input_modalities") or ()):
        capabilities.append(VISION)
    if "audio" in (own.get("input_modalities") or ()):
        capabilities.append(AUDIO)
    return {
        "id": model["id"],
        "object": "model",
        "created": created,
        "owned_by": model.get("source") or "lmsp-tray",
        "context_length": model.get("context_length"),
        "capabilities": capabilities,  # e.g. ["embeddings"] for an embedding model
    }


async def list_models(request: Request) -> Response:
    if asks_anthropic(request):  # Anthropic's clients list models on the same path
        return JSON(model_page(_service(request).list_models()))
    return JSON({"object": "list", "data": [model_object(m) for m in _service(request).list_models()]})


async def get_model(request: Request) -> Response:
    model = _service(request).get_model(request.path_params["model_id"])
    return JSON(model_info(model) if asks_anthropic(request) else model_object(model))


MODEL_ROUTES = [
    Scoped("/models", list_models, GET="models:read"),
    Scoped("/models/{model_id:path}", get_model, GET="models:read"),
]
