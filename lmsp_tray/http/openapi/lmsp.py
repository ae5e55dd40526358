"""LMSP 1.0's own paths in the OpenAPI document: the service document, models, responses, tasks, tokens.

Why hand-written (with the request body taken from the pydantic model that validates it): the API
has shapes a generator cannot see — SSE event streams, problem documents from middleware,
endpoints that need no token. The paths are keyed exactly like the Starlette routes; a test fails
when a route is missing from the document or a path in it has no route, and another fuzzes the
service against the document with schemathesis. An endpoint added to /lmsp/v1 must be described
here too (a download's in `downloads`, the console's in `console`); the shapes its operations refer
to live in `schemas`.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.openapi import downloads, models
from lmsp_tray.http.openapi.parts import (
    IDEMPOTENCY_KEY,
    REPLAYED_HEADER,
    STR,
    VERSION_HEADER,
    accepted_task,
    event_schema_name,
    json_answer,
    json_body,
    operation,
    path_param,
    ref,
)
from lmsp_tray.http.openapi.schemas import EVENTS, stream_description
from lmsp_tray.store.task_rows import TASK_STATUSES

MAX_EVENT_ID = 2**53 - 1
_STATUS_LIST = "(" + "|".join(TASK_STATUSES) + ")"


def _store_operations(example: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stored responses (capability `conversations`) and tasks (PROFILE §4)."""
    response_param = path_param("response_id", "A response id (resp_…) stored with `store: true`.")
    task_param = path_param("task_id", "A task id (task_…).")
    event_id = {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}
    task_json = json_answer("The task.", ref("Task"))
    accepted = accepted_task("The task, queued.")
    events = {
        "description": "Server-sent events, exactly those of a streamed response (ids from 1), from the "
        "resume point on; live until the terminal event." + downloads.stream_note(),
        "headers": dict(VERSION_HEADER),
        "content": {
            "text/event-stream": {
                "schema": {"type": "string", "description": stream_description() + downloads.stream_note()},
                "x-lmsp-events": {e: ref(event_schema_name(e)) for e in [*EVENTS, "error", *downloads.EVENTS]},
            }
        },
    }
    return {
        "/lmsp/v1/responses/{response_id}": {
            "get": operation(
                "A stored response.",
                "responses:read",
                {"200": json_answer("The response.", ref("Response"))},
                params=[response_param],
                problems=("404",),
            ),
            "delete": operation(
                "Delete a stored response.",
                "responses:create",
                {"200": json_answer("Deleted.", ref("ResponseDeleted"))},
                params=[response_param],
                problems=("404",),
            ),
        },
        "/lmsp/v1/tasks": {
            "post": operation(
                "Run a response in the background (same body as POST /responses; `stream` is ignored).",
                "tasks:create",
                {"202": accepted},
                body=json_body(ref("ResponseCreate"), example),
                params=[IDEMPOTENCY_KEY],
                problems=("404", "409", "422", "503"),
            ),
            "get": operation(
                "List tasks, newest first.",
                "tasks:read",
                {"200": json_answer("A page of tasks.", ref("TaskList"))},
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
            "get": operation(
                "A task, with its response once it ended.",
                "tasks:read",
                {"200": task_json},
                params=[task_param],
                problems=("404",),
            )
        },
        "/lmsp/v1/tasks/{task_id}/events": {
            "get": operation(
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
            "post": operation(
                "Cancel a queued or running task; a finished one is returned unchanged.",
                "tasks:create",
                {"200": task_json},
                params=[task_param],
                problems=("404",),
            )
        },
    }


def operations(model: str) -> dict[str, dict[str, Any]]:
    """The /lmsp/v1 paths but the console's; `model` (an available model id) makes the examples runnable."""
    model_param = path_param("model_id", "A model id from GET /lmsp/v1/models.", model)
    response_example = {"model": model, "input": "Say hello.", "max_output_tokens": 8, "temperature": 0}
    response_ok = {
        "description": "The response object; or, with `stream: true`, an event stream.",
        "headers": {**VERSION_HEADER, **REPLAYED_HEADER},
        "content": {
            "application/json": {"schema": ref("Response")},
            "text/event-stream": {
                "schema": {"type": "string", "description": stream_description()},
                "x-lmsp-events": {e: ref(event_schema_name(e)) for e in [*EVENTS, "error"]},
            },
        },
    }
    service_doc = operation(
        "The service document: version, capabilities, scopes, limits.",
        None,
        {"200": json_answer("The service document.", ref("ServiceDocument"))},
    )
    return {
        "/lmsp/v1": {"get": service_doc},
        "/lmsp/v1/": {"get": service_doc},
        "/lmsp/v1/openapi.json": {
            "get": operation("This document.", None, {"200": json_answer("OpenAPI 3.1.", {"type": "object"})})
        },
        "/lmsp/v1/models": {
            "get": operation(
                "List the models discovery found.", "models:read", {"200": json_answer("The models.", ref("ModelList"))}
            )
        },
        "/lmsp/v1/models/{model_id}": {
            "get": operation(
                "One model.",
                "models:read",
                {"200": json_answer("The model.", ref("Model"))},
                params=[model_param],
                problems=("404",),
            ),
            **models.operations(model_param).pop("/lmsp/v1/models/{model_id}"),
        },
        "/lmsp/v1/models/{model_id}/load": {
            "post": operation(
                "Load a model now.",
                "models:manage",
                {"200": json_answer("The model, loaded.", ref("Model"))},
                params=[model_param],
                problems=("404", "429", "503", "507"),
            )
        },
        "/lmsp/v1/models/{model_id}/unload": {
            "post": operation(
                "Unload a model.",
                "models:manage",
                {"200": json_answer("The model.", ref("Model"))},
                params=[model_param],
                problems=("404",),
            )
        },
        "/lmsp/v1/responses": {
            "post": operation(
                "Generate a response (sync or streamed).",
                "responses:create",
                {"200": response_ok},
                body=json_body(ref("ResponseCreate"), response_example, stream={**response_example, "stream": True}),
                params=[IDEMPOTENCY_KEY],
                problems=("404", "409", "410", "422", "429", "503", "507"),
            )
        },
        **{k: v for k, v in models.operations(model_param).items() if k != "/lmsp/v1/models/{model_id}"},
        **_store_operations(response_example),
        **downloads.operations("hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M"),
        "/lmsp/v1/auth/tokens": {
            "get": operation(
                "List tokens (never their secrets).",
                "tokens:manage",
                {"200": json_answer("The tokens, revoked ones too.", ref("TokenList"))},
            ),
            "post": operation(
                "Create a token; the answer is the only place its secret appears.",
                "tokens:manage",
                {"201": json_answer("The token and its secret.", ref("TokenCreated"))},
                body=json_body(ref("TokenCreate"), {"name": "my-app", "scopes": ["models:read"]}),
            ),
        },
        "/lmsp/v1/auth/tokens/{token_id}/revoke": {
            "post": operation(
                "Revoke a token: refused from the next request on.",
                "tokens:manage",
                {"200": json_answer("The revoked token.", ref("Token"))},
                params=[path_param("token_id", "A token id (tok_…).")],
                problems=("404", "409"),
            )
        },
        "/lmsp/v1/auth/pairings": {
            "get": operation(
                "Pairing requests waiting for the user.",
                "tokens:manage",
                {"200": json_answer("The pending requests.", ref("PairingList"))},
            ),
            "post": operation(
                "Ask the user for a token (no token needed; rate-limited).",
                None,
                {
                    "202": json_answer(
                        "The pending request, its user code and the poll token.",
                        ref("PairingCreated"),
                    )
                },
                body=json_body(ref("PairingCreate"), {"app_name": "My App", "scopes": ["models:read"]}),
                problems=("429",),
            ),
        },
        "/lmsp/v1/auth/pairings/{pairing_id}": {
            "get": operation(
                "Poll a pairing request with its poll token; after approval the token comes exactly once.",
                None,
                {"200": json_answer("The request (with `token` once approved).", ref("PairingPoll"))},
                params=[path_param("pairing_id", "The id from the POST (pair_…).")],
                problems=("401", "404", "409"),
                security=[{"pollToken": []}],
            )
        },
        "/lmsp/v1/auth/pairings/dismiss": {
            "post": operation(
                "Deny every pending pairing request at once (a flood of them dismissed in one action).",
                "tokens:manage",
                {"200": json_answer("The requests denied.", ref("PairingList"))},
            )
        },
        "/lmsp/v1/auth/pairings/{ref}/approve": {
            "post": operation(
                "Approve a pairing request (by id or user code).",
                "tokens:manage",
                {"200": json_answer("The approved request.", ref("Pairing"))},
                params=[path_param("ref", "A pairing id or its user code.")],
                problems=("404", "409"),
            )
        },
        "/lmsp/v1/auth/pairings/{ref}/deny": {
            "post": operation(
                "Deny a pairing request (by id or user code).",
                "tokens:manage",
                {"200": json_answer("The denied request.", ref("Pairing"))},
                params=[path_param("ref", "A pairing id or its user code.")],
                problems=("404", "409"),
            )
        },
    }
