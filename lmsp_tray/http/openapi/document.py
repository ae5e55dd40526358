"""The whole OpenAPI 3.1 document, served at ``GET /lmsp/v1/openapi.json``: the surfaces put together.

Why a module: each surface describes its own paths and shapes (`lmsp`, `downloads` through
`lmsp`, `console`, `openai`, `anthropic`, `ollama`; LMSP's shapes in `schemas`), and this is the one place that knows
them all — the order of the paths and schemas, the document's info, servers and security schemes.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray import __version__
from lmsp_tray.http.openapi import anthropic, console, downloads, lmsp, models, ollama, openai, tokenize
from lmsp_tray.http.openapi.schemas import component_schemas

DEFAULT_EXAMPLE_MODEL = "qwen3:14b-q4_k_m"


def build_openapi(example_model: str | None = None) -> dict[str, Any]:
    """The document; `example_model` (an available model id) makes the examples runnable."""
    model = example_model or DEFAULT_EXAMPLE_MODEL
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "lmsp-tray LMSP 1.0 API",
            "version": __version__,
            "description": "LMSP 1.0 on loopback, and the OpenAI-compatible `/v1` on the same port (OpenAI's "
            "shapes and error object; schemas named V1…). Every endpoint but the service document, this "
            "document and pairing needs `Authorization: Bearer <token>` with the scope in `x-lmsp-scope`.",
        },
        "servers": [{"url": "/"}],
        "paths": {
            **lmsp.operations(model),
            **tokenize.operations(model),
            **console.operations(),
            **openai.operations(model),
            **anthropic.operations(model),
            **ollama.operations(model),
        },
        "components": {
            "schemas": {
                **console.schemas(),
                **component_schemas(),
                **downloads.schemas(),
                **tokenize.schemas(),
                **models.schemas(),
                **openai.schemas(),
                **anthropic.schemas(),
                **ollama.schemas(),
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An lmsp_… token."},
                "pollToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The poll_token from POST /auth/pairings (lmspp_…).",
                },
            },
        },
    }
