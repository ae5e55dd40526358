"""Anthropic's Messages API in the OpenAPI document: its operations, bodies, answers and errors.

Why a module of its own: `POST /v1/messages` and `/v1/messages/count_tokens`
(`http/anthropic/`) take Anthropic's bodies (the pydantic `MessageCreate` that
validates them), answer with Anthropic's message object and event stream, and
write errors as Anthropic's `{"type": "error", "error": {"type", "message"}}`.
`document.build_openapi` merges `operations()` and `schemas()` in; every schema
here is named Anthropic….
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.openapi.parts import (
    INT,
    PROBLEMS,
    REF,
    REPLAYED_HEADER,
    STR,
    VERSION_HEADER,
    error_headers,
    operation,
)
from lmsp_tray.http.openapi.parts import nullable as _nullable
from lmsp_tray.http.openapi.parts import obj as _obj
from lmsp_tray.http.openapi.parts import ref as _ref
from lmsp_tray.protocol.anthropic import CountTokens, MessageCreate
from lmsp_tray.protocol.anthropic_events import error_type

PREFIX = "Anthropic"
JSON = "application/json"
SSE = "text/event-stream"
TAG = "Anthropic-compatible /v1/messages"
GENERATION_ERRORS = ("404", "409", "422", "429", "503", "507")
STREAM = (
    "With `stream: true`: Anthropic's events (this schema is one event), each an `event:` line with its name and "
    "a `data:` line with its JSON (same `type`): message_start, ping, then per content block "
    "content_block_start, content_block_delta (text_delta, thinking_delta and signature_delta, input_json_delta), "
    "content_block_stop; then message_delta (stop_reason, stop_sequence, usage) and message_stop. A `ping` event "
    "is the keep-alive; a failure after the first byte is an `error` event with Anthropic's error object."
)


def _error(status: str) -> dict[str, Any]:
    return {
        "description": f"{PROBLEMS[status]} Anthropic's error object: `error.type` is `{error_type(int(status))}`.",
        "headers": error_headers(status),
        "content": {JSON: {"schema": _ref(PREFIX + "Error")}},
    }


def _pydantic(model: Any, name: str) -> dict[str, Any]:
    """`name` and the shapes it uses, from a pydantic model, each under the Anthropic prefix."""
    schema = model.model_json_schema(by_alias=True, ref_template=REF + PREFIX + "{model}")
    defs = schema.pop("$defs", {})
    schema["title"] = PREFIX + name
    return {PREFIX + name: schema, **{PREFIX + k: v for k, v in defs.items()}}


def operations(model: str) -> dict[str, dict[str, Any]]:
    """The Anthropic paths; `model` (an available model id) makes the examples runnable."""
    example = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
    event = _obj({"event": STR, "data": {"type": "string", "contentMediaType": JSON}})
    message = {
        "description": "The message (Anthropic's shape; `model` is the name asked for).",
        "headers": {**VERSION_HEADER, **REPLAYED_HEADER},
        "content": {JSON: {"schema": _ref(PREFIX + "Message")}, SSE: {"schema": {**event, "description": STREAM}}},
    }
    counted = {
        "description": "The prompt's tokens on that model.",
        "headers": dict(VERSION_HEADER),
        "content": {JSON: {"schema": _obj({"input_tokens": INT})}},
    }

    def body(schema: str) -> dict[str, Any]:
        return {"required": True, "content": {JSON: {"schema": _ref(schema), "example": example}}}

    def op(summary: str, answer: dict[str, Any], schema: str) -> dict[str, Any]:
        return operation(
            summary,
            "responses:create",
            {"200": answer},
            body=body(schema),
            problems=GENERATION_ERRORS,
            error=_error,
            tags=[TAG],
        )

    return {
        "/v1/messages": {
            "post": op(
                "Create a message (Anthropic's Messages API; `x-api-key` or a bearer token).",
                message,
                PREFIX + "MessageCreate",
            )
        },
        "/v1/messages/count_tokens": {
            "post": op("Count a message request's prompt tokens.", counted, PREFIX + "CountTokens")
        },
    }


def schemas() -> dict[str, Any]:
    """The Anthropic shapes, all named Anthropic…."""
    usage = _obj(
        {"input_tokens": INT, "output_tokens": INT},
        {"cache_read_input_tokens": INT, "cache_creation_input_tokens": INT},
    )
    message = _obj(
        {
            "id": STR,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": STR,
            "content": {"type": "array", "items": _obj({"type": STR})},
            "stop_reason": _nullable({"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}),
            "stop_sequence": _nullable(STR),
            "usage": usage,
        }
    )
    error = _obj({"type": {"const": "error"}, "error": _obj({"type": STR, "message": STR})})
    return {
        **_pydantic(MessageCreate, "MessageCreate"),
        **_pydantic(CountTokens, "CountTokens"),
        PREFIX + "Message": message,
        PREFIX + "Error": error,
    }
