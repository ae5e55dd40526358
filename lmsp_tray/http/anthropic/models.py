"""`GET /v1/models` and `GET /v1/models/{id}` as Anthropic's clients read them.

Why: the path is OpenAI's too; Anthropic's SDKs and Claude Code tell
themselves apart by the `anthropic-version` header they always send, and
expect Anthropic's model object (`{"type": "model", "id", "display_name",
"created_at"}`, a page with `has_more`, `first_id`, `last_id`). The OpenAI
handlers answer with these when that header is present.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from starlette.requests import Request

ANTHROPIC_VERSION = "anthropic-version"


def asks_anthropic(request: Request) -> bool:
    return ANTHROPIC_VERSION in request.headers


def model_info(model: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's model object for one model of the LMSP listing."""
    own = (model.get("extensions") or {}).get("lmsp_tray") or {}
    try:
        created = os.stat(own["path"]).st_mtime
    except (KeyError, TypeError, OSError):
        created = 0.0
    return {
        "type": "model",
        "id": model["id"],
        "display_name": model["id"],
        "created_at": datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat().replace("+00:00", "Z"),
        "max_input_tokens": model.get("context_length"),
    }


def model_page(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Every model on one page (Anthropic's list: `data`, `has_more`, `first_id`, `last_id`)."""
    data = [model_info(m) for m in models]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
