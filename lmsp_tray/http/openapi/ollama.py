"""The Ollama-compatible API (`GET /`, `/api/…`) in the OpenAPI document: its operations, bodies, answers and errors.

Why a module of its own: Ollama's API (`http/ollama/`) is a third API on the same port
with Ollama's shapes — its request bodies are the pydantic models that validate them
(`protocol.ollama_requests`), its errors are `{"error": "…"}`, and its streams are
NDJSON lines (`application/x-ndjson`), the last with `done: true`. `document.build_openapi`
merges `operations()` and `schemas()` in. The tokens and scopes are the same as
`/lmsp/v1`'s (`bearer`, `x-lmsp-scope`); without a token, `keyless_scopes` applies.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.openapi.parts import BOOL, PROBLEMS, STR, error_headers, operation
from lmsp_tray.http.openapi.parts import obj as _obj
from lmsp_tray.http.openapi.parts import ref as _ref
from lmsp_tray.protocol.ollama_requests import ChatCreate, EmbedCreate, GenerateCreate, LegacyEmbedCreate

PREFIX = "Ollama"  # every Ollama schema is named Ollama…
JSON = "application/json"
NDJSON = "application/x-ndjson"
TAG = "Ollama-compatible /api"
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _error(status: str) -> dict[str, Any]:
    return {
        "description": f"{PROBLEMS[status]} Ollama's error object: the text is `error`.",
        "headers": error_headers(status),
        "content": {JSON: {"schema": _ref(PREFIX + "Error")}},
    }


def _op(
    summary: str,
    scope: str | None,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    errors: tuple[str, ...] = (),
) -> dict[str, Any]:
    return operation(summary, scope, responses, body=body, problems=errors, error=_error, tags=[TAG])


def _ok(description: str, schema: dict[str, Any], *, stream: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {JSON: {"schema": schema}}
    if stream:
        content[NDJSON] = {
            "schema": {
                "type": "string",
                "description": "One JSON object a line; the last has "
                '`done: true` (or `status: success`), or is `{"error": …}`.',
            }
        }
    return {"description": description, "content": content}


def _body(schema: str, example: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": _ref(PREFIX + schema), "example": example}}}


def _name_body() -> dict[str, Any]:
    return _body("ModelName", {"model": "qwen3:14b-q4_k_m"})


def operations(model: str) -> dict[str, dict[str, Any]]:
    """The Ollama API's paths (`model`: the id the examples use)."""
    generating = ("400", "404", "429", "503", "507")
    return {
        "/": {
            "get": _op(
                "The probe Ollama's apps send: 'Ollama is running'.",
                None,
                {"200": {"description": "Always.", "content": {"text/plain": {"schema": STR}}}},
            )
        },
        "/api/version": {"get": _op("The Ollama API version spoken.", None, {"200": _ok("The version.", ANY_OBJECT)})},
        "/api/tags": {
            "get": _op("Every model found, in Ollama's shape.", "models:read", {"200": _ok("The list.", ANY_OBJECT)})
        },
        "/api/show": {
            "post": _op(
                "One model: details, model_info, capabilities, template, window.",
                "models:read",
                {"200": _ok("The model.", ANY_OBJECT)},
                body=_name_body(),
                errors=("404",),
            )
        },
        "/api/ps": {
            "get": _op(
                "The loaded models, their memory and expiry.", "models:read", {"200": _ok("The list.", ANY_OBJECT)}
            )
        },
        "/api/chat": {
            "post": _op(
                "A chat turn (NDJSON lines unless `stream: false`); no messages: load (or unload) the model.",
                "responses:create",
                {"200": _ok("The answer.", ANY_OBJECT, stream=True)},
                body=_body(
                    "ChatCreate",
                    {"model": model, "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 16}},
                ),
                errors=generating,
            )
        },
        "/api/generate": {
            "post": _op(
                "A completion of `prompt` (templated, `raw`, or filled in before `suffix`); no prompt: load.",
                "responses:create",
                {"200": _ok("The answer.", ANY_OBJECT, stream=True)},
                body=_body(
                    "GenerateCreate", {"model": model, "prompt": "Hi", "stream": False, "options": {"num_predict": 16}}
                ),
                errors=generating,
            )
        },
        "/api/embed": {
            "post": _op(
                "Embeddings of `input` (cut to the window unless `truncate: false`).",
                "responses:create",
                {"200": _ok("The vectors.", ANY_OBJECT)},
                body=_body("EmbedCreate", {"model": model, "input": "Hi"}),
                errors=generating,
            )
        },
        "/api/embeddings": {
            "post": _op(
                "The older embedding endpoint: one `prompt`, one `embedding`.",
                "responses:create",
                {"200": _ok("The vector.", ANY_OBJECT)},
                body=_body("LegacyEmbedCreate", {"model": model, "prompt": "Hi"}),
                errors=generating,
            )
        },
        "/api/pull": {
            "post": _op(
                "Download a model from Hugging Face (hf.co/<org>/<repo>:<quant>) with Ollama's progress lines.",
                "models:manage",
                {"200": _ok("The progress, or the outcome.", ANY_OBJECT, stream=True)},
                body=_body("ModelName", {"model": "hf.co/org/repo:Q4_K_M"}),
                errors=("404", "409", "502", "503", "507"),
            )
        },
        "/api/delete": {
            "delete": _op(
                "Deletes a model the service owns (its own folder, its downloads); another app's file is 409.",
                "models:manage",
                {"200": {"description": "Deleted (an empty body, as Ollama answers)."}},
                body=_name_body(),
                errors=("404", "409", "503"),
            )
        },
        **{
            f"/api/{verb}": {
                "post": _op(f"Refused: {verb} is not supported (the error says why).", "models:manage", {}, body=_any())
            }
            for verb in ("create", "copy", "push")
        },
    }


def _any() -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": ANY_OBJECT}}}


def _pydantic(model: Any) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/" + PREFIX + "{model}")
    defs = schema.pop("$defs", {})
    return {**{PREFIX + k: v for k, v in defs.items()}, "root": schema}


def schemas() -> dict[str, Any]:
    out: dict[str, Any] = {
        PREFIX + "Error": _obj({"error": STR}),
        PREFIX + "ModelName": _obj({"model": {**STR, "minLength": 1}}, {"name": STR, "stream": BOOL, "verbose": BOOL}),
    }
    for name, model in (
        ("ChatCreate", ChatCreate),
        ("GenerateCreate", GenerateCreate),
        ("EmbedCreate", EmbedCreate),
        ("LegacyEmbedCreate", LegacyEmbedCreate),
    ):
        parts = _pydantic(model)
        out.update({k: v for k, v in parts.items() if k != "root"})
        out[PREFIX + name] = parts["root"]
    return out
