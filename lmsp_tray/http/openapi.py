"""The OpenAPI 3.1 document of the API, served at ``GET /lmsp/v1/openapi.json``.

Why hand-written (with the request body taken from the pydantic model that
validates it): the API has shapes a generator cannot see — SSE event
streams, problem documents from middleware, endpoints that need no token.
`OPERATIONS` is keyed by (method, path) exactly like the Starlette routes;
a test fails when a route is missing here or a path here has no route, and
another fuzzes the service against this document with schemathesis.
An endpoint added elsewhere must be described here too; the shapes its
operations refer to live in `openapi_schemas`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmsp_tray import __version__
from lmsp_tray.http import openapi_downloads as downloads
from lmsp_tray.http.openapi_parts import REF, STR
from lmsp_tray.http.openapi_parts import ref as _ref
from lmsp_tray.http.openapi_schemas import EVENTS, component_schemas, event_name, stream_description
from lmsp_tray.store.task_rows import TASK_STATUSES

PROBLEM_JSON = "application/problem+json"
VERSION_HEADER = {"LMSP-Version": {"description": "Always 1.0.", "required": True, "schema": {"const": "1.0"}}}
AUTH_HEADER = {"WWW-Authenticate": {"required": True, "schema": STR}}

PROBLEMS = {
    "400": "The request is malformed (invalid_request, invalid_json, unsupported_version, "
    "unsupported_capability, context_length_exceeded).",
    "401": "No, or no valid, bearer token (unauthorized).",
    "403": "The token lacks the scope (insufficient_scope), or the Host (forbidden_host) or Origin "
    "(forbidden_origin) is not allowed; for a pull, a gated or private repository the user has no access to "
    "(gated_repository, with `license_url`: the page to accept the licence on).",
    "404": "Nothing with that id (model_not_found, response_not_found, task_not_found, not_found); for a pull, "
    "no such repository (repository_not_found) or no such file or quantization in it (file_not_found).",
    "405": "The method is not allowed on this path (method_not_allowed).",
    "409": "The request conflicts with the current state (conflict), or a request with this Idempotency-Key "
    "is still running (idempotency_key_in_progress).",
    "410": "The events asked for are past the retention period (event_history_expired); read the task instead.",
    "413": "The body is over the limit (payload_too_large).",
    "422": "The Idempotency-Key was used with another body (idempotency_key_reused).",
    "429": "Too many requests (too_many_requests); see Retry-After.",
    "500": "An unexpected error (internal_error); details are only in the service log.",
    "502": "Hugging Face could not be reached or answered unexpectedly (hub_unavailable).",
    "503": "The model cannot serve now (model_load_failed, model_crashed, service_unavailable).",
    "507": "Not enough memory to load the model (insufficient_memory); for a pull, not enough disk space "
    "(insufficient_storage, with `required_bytes`, `available_bytes` and `path`).",
}


def error_headers(status: str) -> dict[str, Any]:
    """The headers of an error answer, on either surface: `WWW-Authenticate` on 401, `Retry-After` on 429."""
    headers = dict(VERSION_HEADER)
    if status == "401":
        headers.update(AUTH_HEADER)
    if status == "429":
        headers["Retry-After"] = {"required": True, "schema": STR}
    return headers


def _problem(status: str) -> dict[str, Any]:
    return {
        "description": PROBLEMS[status],
        "headers": error_headers(status),
        "content": {PROBLEM_JSON: {"schema": _ref("Problem")}},
    }


def _json(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "headers": dict(VERSION_HEADER),
        "content": {"application/json": {"schema": schema}},
        **extra,
    }


def _body(schema: dict[str, Any], example: Any = None, **more: Any) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": schema}
    if more:
        media["examples"] = {"default": {"value": example}, **{k: {"value": v} for k, v in more.items()}}
    elif example is not None:
        media["example"] = example
    return {"required": True, "content": {"application/json": media}}


def _op(
    summary: str,
    scope: str | None,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    problems: tuple[str, ...] = (),
    security: list[dict[str, list[str]]] | None = None,
    error: Callable[[str], dict[str, Any]] = _problem,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """An operation: its scope (None: `security` as given), and an `error` answer (a problem document
    on /lmsp/v1) for each status in `problems` and those every such operation can give."""
    op: dict[str, Any] = {"summary": summary, "responses": dict(responses)}
    if tags:
        op["tags"] = tags
    if scope is None:
        op["security"] = security if security is not None else []
    else:
        op["security"] = [{"bearer": [scope]}]
        op["x-lmsp-scope"] = scope
        problems = ("401", "403", *problems)
    if body is not None:
        op["requestBody"] = body
        problems = (*problems, "400", "413")
    for status in sorted({*problems, "403", "500"}):
        op["responses"][status] = error(status)
    if params:
        op["parameters"] = params
    return op


def _path_param(name: str, description: str, example: str | None = None) -> dict[str, Any]:
    param: dict[str, Any] = {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "minLength": 1},
    }
    if example is not None:
        param["example"] = example
    return param


REPLAYED_HEADER = {
    "Idempotent-Replayed": {
        "description": "`true` when this answer replays an earlier request with the same Idempotency-Key.",
        "schema": {"const": "true"},
    }
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Run once: a retry with the same key and body replays the result (kept 24 h).",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
}
MAX_EVENT_ID = 2**53 - 1
_STATUS_LIST = "(" + "|".join(TASK_STATUSES) + ")"


def _store_ops(example: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stored responses (capability `conversations`) and tasks (PROFILE §4)."""
    response_param = _path_param("response_id", "A response id (resp_…) stored with `store: true`.")
    task_param = _path_param("task_id", "A task id (task_…).")
    event_id = {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}
    task_json = _json("The task.", _ref("Task"))
    accepted = _json("The task, queued.", _ref("Task"))
    accepted["headers"] = {
        **accepted["headers"],
        **REPLAYED_HEADER,
        "Location": {"required": True, "schema": STR, "description": "/lmsp/v1/tasks/{id}"},
    }
    events = {
        "description": "Server-sent events, exactly those of a streamed response (ids from 1), from the "
        "resume point on; live until the terminal event." + downloads.stream_note(),
        "headers": dict(VERSION_HEADER),
        "content": {
            "text/event-stream": {
                "schema": {"type": "string", "description": stream_description() + downloads.stream_note()},
                "x-lmsp-events": {
                    e: {"$ref": REF + downloads.event_schema_name(e)} for e in [*EVENTS, "error", *downloads.EVENTS]
                },
            }
        },
    }
    return {
        "/lmsp/v1/responses/{response_id}": {
            "get": _op(
                "A stored response.",
                "responses:read",
                {"200": _json("The response.", _ref("Response"))},
                params=[response_param],
                problems=("404",),
            ),
            "delete": _op(
                "Delete a stored response.",
                "responses:create",
                {"200": _json("Deleted.", _ref("ResponseDeleted"))},
                params=[response_param],
                problems=("404",),
            ),
        },
        "/lmsp/v1/tasks": {
            "post": _op(
                "Run a response in the background (same body as POST /responses; `stream` is ignored).",
                "tasks:create",
                {"202": accepted},
                body=_body(_ref("ResponseCreate"), example),
                params=[IDEMPOTENCY_KEY],
                problems=("404", "409", "422", "503"),
            ),
            "get": _op(
                "List tasks, newest first.",
                "tasks:read",
                {"200": _json("A page of tasks.", _ref("TaskList"))},
                params=[
                    {
                        "name": "status",
                        "in": "query",
                        "required": False,
                        "description": "Only tasks in these states (comma-separated).",
                        "schema": {"type": "string", "pattern": f"^{_STATUS_LIST}(,{_STATUS_LIST})*$"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    },
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "description": "The last id of the previous page.",
                        "schema": STR,
                    },
                ],
                problems=("400", "404"),
            ),
        },
        "/lmsp/v1/tasks/{task_id}": {
            "get": _op(
                "A task, with its response once it ended.",
                "tasks:read",
                {"200": task_json},
                params=[task_param],
                problems=("404",),
            )
        },
        "/lmsp/v1/tasks/{task_id}/events": {
            "get": _op(
                "Follow a task's events; resume with `after` or Last-Event-ID (`after` wins).",
                "tasks:read",
                {"200": events},
                params=[
                    task_param,
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "schema": event_id,
                        "description": "Send only events with a greater id.",
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": event_id,
                        "description": "The last event id received (SSE reconnection).",
                    },
                ],
                problems=("400", "404", "410"),
            )
        },
        "/lmsp/v1/tasks/{task_id}/cancel": {
            "post": _op(
                "Cancel a queued or running task; a finished one is returned unchanged.",
                "tasks:create",
                {"200": task_json},
                params=[task_param],
                problems=("404",),
            )
        },
    }


def build_openapi(example_model: str | None = None) -> dict[str, Any]:
    """The document; `example_model` (an available model id) makes the examples runnable."""
    model = example_model or "qwen3:14b-q4_k_m"
    model_param = _path_param("model_id", "A model id from GET /lmsp/v1/models.", model)
    response_example = {"model": model, "input": "Say hello.", "max_output_tokens": 8, "temperature": 0}
    response_ok = {
        "description": "The response object; or, with `stream: true`, an event stream.",
        "headers": {**VERSION_HEADER, **REPLAYED_HEADER},
        "content": {
            "application/json": {"schema": _ref("Response")},
            "text/event-stream": {
                "schema": {"type": "string", "description": stream_description()},
                "x-lmsp-events": {e: {"$ref": REF + event_name(e)} for e in [*EVENTS, "error"]},
            },
        },
    }
    service_doc = _op(
        "The service document: version, capabilities, scopes, limits.",
        None,
        {"200": _json("The service document.", _ref("ServiceDocument"))},
    )
    ops: dict[str, dict[str, Any]] = {
        "/lmsp/v1": {"get": service_doc},
        "/lmsp/v1/": {"get": service_doc},
        "/lmsp/v1/openapi.json": {
            "get": _op("This document.", None, {"200": _json("OpenAPI 3.1.", {"type": "object"})})
        },
        "/lmsp/v1/models": {
            "get": _op(
                "List the models discovery found.", "models:read", {"200": _json("The models.", _ref("ModelList"))}
            )
        },
        "/lmsp/v1/models/{model_id}": {
            "get": _op(
                "One model.",
                "models:read",
                {"200": _json("The model.", _ref("Model"))},
                params=[model_param],
                problems=("404",),
            )
        },
        "/lmsp/v1/models/{model_id}/load": {
            "post": _op(
                "Load a model now.",
                "models:manage",
                {"200": _json("The model, loaded.", _ref("Model"))},
                params=[model_param],
                problems=("404", "429", "503", "507"),
            )
        },
        "/lmsp/v1/models/{model_id}/unload": {
            "post": _op(
                "Unload a model.",
                "models:manage",
                {"200": _json("The model.", _ref("Model"))},
                params=[model_param],
                problems=("404",),
            )
        },
        "/lmsp/v1/responses": {
            "post": _op(
                "Generate a response (sync or streamed).",
                "responses:create",
                {"200": response_ok},
                body=_body(_ref("ResponseCreate"), response_example, stream={**response_example, "stream": True}),
                params=[IDEMPOTENCY_KEY],
                problems=("404", "409", "410", "422", "429", "503", "507"),
            )
        },
        **_store_ops(response_example),
        **downloads.operations("hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M"),
        "/lmsp/v1/auth/tokens": {
            "get": _op(
                "List tokens (never their secrets).",
                "tokens:manage",
                {"200": _json("The tokens, revoked ones too.", _ref("TokenList"))},
            ),
            "post": _op(
                "Create a token; the answer is the only place its secret appears.",
                "tokens:manage",
                {"201": _json("The token and its secret.", _ref("TokenCreated"))},
                body=_body(_ref("TokenCreate"), {"name": "my-app", "scopes": ["models:read"]}),
            ),
        },
        "/lmsp/v1/auth/tokens/{token_id}/revoke": {
            "post": _op(
                "Revoke a token: refused from the next request on.",
                "tokens:manage",
                {"200": _json("The revoked token.", _ref("Token"))},
                params=[_path_param("token_id", "A token id (tok_…).")],
                problems=("404", "409"),
            )
        },
        "/lmsp/v1/auth/pairings": {
            "get": _op(
                "Pairing requests waiting for the user.",
                "tokens:manage",
                {"200": _json("The pending requests.", _ref("PairingList"))},
            ),
            "post": _op(
                "Ask the user for a token (no token needed; rate-limited).",
                None,
                {
                    "202": _json(
                        "The pending request, its user code and the poll token.",
                        _ref("PairingCreated"),
                    )
                },
                body=_body(_ref("PairingCreate"), {"app_name": "My App", "scopes": ["models:read"]}),
                problems=("429",),
            ),
        },
        "/lmsp/v1/auth/pairings/{pairing_id}": {
            "get": _op(
                "Poll a pairing request with its poll token; after approval the token comes exactly once.",
                None,
                {"200": _json("The request (with `token` once approved).", _ref("PairingPoll"))},
                params=[_path_param("pairing_id", "The id from the POST (pair_…).")],
                problems=("401", "404", "409"),
                security=[{"pollToken": []}],
            )
        },
        "/lmsp/v1/auth/pairings/dismiss": {
            "post": _op(
                "Deny every pending pairing request at once (a flood of them dismissed in one action).",
                "tokens:manage",
                {"200": _json("The requests denied.", _ref("PairingList"))},
            )
        },
        "/lmsp/v1/auth/pairings/{ref}/approve": {
            "post": _op(
                "Approve a pairing request (by id or user code).",
                "tokens:manage",
                {"200": _json("The approved request.", _ref("Pairing"))},
                params=[_path_param("ref", "A pairing id or its user code.")],
                problems=("404", "409"),
            )
        },
        "/lmsp/v1/auth/pairings/{ref}/deny": {
            "post": _op(
                "Deny a pairing request (by id or user code).",
                "tokens:manage",
                {"200": _json("The denied request.", _ref("Pairing"))},
                params=[_path_param("ref", "A pairing id or its user code.")],
                problems=("404", "409"),
            )
        },
    }
    from lmsp_tray.http import openapi_openai  # it builds on this module's helpers
    from lmsp_tray.http.openapi_console import console_operations

    ops.update(console_operations())
    ops.update(openapi_openai.operations(model))
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
        "paths": ops,
        "components": {
            "schemas": {**component_schemas(), **openapi_openai.schemas()},
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
