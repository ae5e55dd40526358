"""The builder kit every part of the OpenAPI document is made with: schema shapes, answers, operations.

Why a module: the document is assembled from one module per surface (`lmsp`, `downloads`,
`console`, `openai`) and the shapes they refer to (`schemas`); each needs the same references,
nullable and object shapes, the same headers, problem answers and operation skeleton. One
definition keeps them identical, and it sits at the bottom of the package: it imports none of
its siblings, so no surface reaches into another's helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REF = "#/components/schemas/"
NULL = {"type": "null"}
STR, INT, BOOL, NUM = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}

PROBLEM_JSON = "application/problem+json"
VERSION_HEADER = {"LMSP-Version": {"description": "Always 1.0.", "required": True, "schema": {"const": "1.0"}}}
AUTH_HEADER = {"WWW-Authenticate": {"required": True, "schema": STR}}
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


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, NULL]}


def obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


def event_schema_name(event: str) -> str:
    """The component schema of a stream event: ``response.created`` -> ``Event_response_created``."""
    return "Event_" + event.replace(".", "_")


def error_headers(status: str) -> dict[str, Any]:
    """The headers of an error answer, on either surface: `WWW-Authenticate` on 401, `Retry-After` on 429."""
    headers = dict(VERSION_HEADER)
    if status == "401":
        headers.update(AUTH_HEADER)
    if status == "429":
        headers["Retry-After"] = {"required": True, "schema": STR}
    return headers


def problem(status: str) -> dict[str, Any]:
    """An error answer of /lmsp/v1: a problem document."""
    return {
        "description": PROBLEMS[status],
        "headers": error_headers(status),
        "content": {PROBLEM_JSON: {"schema": ref("Problem")}},
    }


def json_answer(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A JSON answer with the LMSP-Version header."""
    return {
        "description": description,
        "headers": dict(VERSION_HEADER),
        "content": {"application/json": {"schema": schema}},
        **extra,
    }


def json_body(schema: dict[str, Any], example: Any = None, **more: Any) -> dict[str, Any]:
    """A required JSON request body; `more`: further named examples beside the default one."""
    media: dict[str, Any] = {"schema": schema}
    if more:
        media["examples"] = {"default": {"value": example}, **{k: {"value": v} for k, v in more.items()}}
    elif example is not None:
        media["example"] = example
    return {"required": True, "content": {"application/json": media}}


def operation(
    summary: str,
    scope: str | None,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    problems: tuple[str, ...] = (),
    security: list[dict[str, list[str]]] | None = None,
    error: Callable[[str], dict[str, Any]] = problem,
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


def path_param(name: str, description: str, example: str | None = None) -> dict[str, Any]:
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


def accepted_task(description: str) -> dict[str, Any]:
    """A 202 answer carrying a task: its Location, and Idempotent-Replayed on a replay."""
    answer = json_answer(description, ref("Task"))
    answer["headers"] = {
        **answer["headers"],
        **REPLAYED_HEADER,
        "Location": {"required": True, "schema": STR, "description": "/lmsp/v1/tasks/{id}"},
    }
    return answer
