"""The `components.schemas` of the OpenAPI document: every response, request and event shape.

Why a module of its own: `openapi` assembles the paths and operations; the shapes they refer to
(`$ref`) are a separate, long list that changes when a wire object changes, not when an endpoint
does. The response events are listed once here (`EVENTS`): their schemas, the stream
descriptions and the `x-lmsp-events` maps of the operations are all built from that list.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.auth.tokens import MAX_NAME, NAME_PATTERN, SCOPES
from lmsp_tray.http import openapi_downloads as downloads
from lmsp_tray.http.openapi_parts import BOOL, INT, REF, STR
from lmsp_tray.http.openapi_parts import nullable as _nullable
from lmsp_tray.http.openapi_parts import obj as _obj
from lmsp_tray.http.openapi_parts import ref as _ref
from lmsp_tray.protocol.requests import ResponseCreate
from lmsp_tray.store.task_rows import TASK_STATUSES

SCOPE = {"type": "string", "enum": list(SCOPES)}
SCOPE_LIST = {"type": "array", "items": SCOPE, "minItems": 1}
NAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_NAME,
    "pattern": NAME_PATTERN,
    "description": "Shown in the tray: no control or invisible formatting characters.",
}


def component_schemas() -> dict[str, Any]:
    request = ResponseCreate.model_json_schema(by_alias=True, ref_template=REF + "{model}")
    defs = request.pop("$defs", {})
    problem = _obj(
        {"type": STR, "title": STR, "status": INT, "detail": STR, "code": STR}, {"param": STR, "message": STR}
    )
    item = {
        "type": "object",
        "required": ["id", "type"],
        "properties": {"id": STR, "type": {"enum": ["message", "function_call", "reasoning"]}},
    }
    usage = _obj(
        {"input_tokens": INT, "output_tokens": INT, "total_tokens": INT},
        {"input_tokens_details": _obj({"cached_tokens": INT})},
    )
    status = {"enum": ["in_progress", "completed", "incomplete", "failed", "cancelled"]}
    response = _obj(
        {
            "id": STR,
            "object": {"const": "response"},
            "created_at": INT,
            "status": status,
            "model": STR,
            "output": {"type": "array", "items": _ref("OutputItem")},
            "usage": _nullable(_ref("Usage")),
            "error": _nullable(_ref("Problem")),
            "incomplete_details": _nullable(_obj({"reason": STR})),
        }
    )
    model = _obj(
        {
            "id": STR,
            "object": {"const": "model"},
            "architecture": _nullable(STR),
            "parameters": _nullable(STR),
            "quantization": _nullable(STR),
            "context_length": INT,
            "size_bytes": INT,
            "capabilities": {"type": "array", "items": STR},
            "state": {"enum": ["available", "loading", "loaded", "unloading", "error"]},
            "source": STR,
            "error": _nullable(_ref("Problem")),
        },
        {
            "extensions": {
                "type": "object",
                "properties": {
                    "lmsp_tray": {
                        "type": "object",
                        "properties": {
                            "fill_in_the_middle": {
                                "type": "boolean",
                                "description": "POST /v1/completions can fill in between `prompt` and `suffix`: "
                                "the model's GGUF has FIM prefix, suffix and middle tokens.",
                            }
                        },
                    }
                },
            }
        },
    )
    token = _obj(
        {
            "id": STR,
            "object": {"const": "token"},
            "name": STR,
            "scopes": {"type": "array", "items": SCOPE},
            "created_at": INT,
            "last_used_at": _nullable(INT),
            "revoked_at": _nullable(INT),
            "owner": BOOL,
        }
    )
    pairing = _obj(
        {
            "id": STR,
            "object": {"const": "pairing"},
            "app_name": STR,
            "scopes": {"type": "array", "items": SCOPE},
            "user_code": STR,
            "status": {"enum": ["pending", "approved", "denied", "expired"]},
            "created_at": INT,
            "expires_at": INT,
            "token_id": _nullable(STR),
        }
    )
    from lmsp_tray.http.openapi_console import console_schemas  # it imports openapi, which imports this module

    schemas: dict[str, Any] = {
        **console_schemas(),
        **defs,
        "ResponseCreate": request,
        "Problem": problem,
        "Usage": usage,
        "OutputItem": item,
        "Response": response,
        "Model": model,
        "ModelList": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}),
        "ServiceDocument": _obj(
            {
                "object": {"const": "service"},
                "lmsp_version": STR,
                "versions": {"type": "array", "items": STR},
                "service": _obj({"name": STR, "version": STR}),
                "capabilities": {"type": "array", "items": STR},
                "auth": _obj({"type": {"const": "bearer"}, "scopes": {"type": "array", "items": STR}}),
                "limits": {"type": "object"},
            }
        ),
        "ResponseDeleted": _obj({"id": STR, "object": {"const": "response.deleted"}, "deleted": {"const": True}}),
        "Task": _obj(
            {
                "id": STR,
                "object": {"const": "task"},
                "status": {"enum": list(TASK_STATUSES)},
                "created_at": INT,
                "updated_at": INT,
                "response_id": _nullable(STR),
                "response": _nullable(_ref("Response")),
                "error": _nullable(_ref("Problem")),
            },
            {
                "kind": {
                    "const": "model.download",
                    "description": "Only on tasks that are not background responses: a model download.",
                },
                "download": _nullable(_ref("ModelDownload")),
            },
        ),
        "TaskList": _obj(
            {
                "object": {"const": "list"},
                "data": {"type": "array", "items": _ref("Task")},
                "first_id": _nullable(STR),
                "last_id": _nullable(STR),
                "has_more": BOOL,
            }
        ),
        "Token": token,
        "TokenList": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Token")}}),
        "TokenCreate": _obj({"name": NAME, "scopes": SCOPE_LIST}),
        "TokenCreated": {
            "allOf": [_ref("Token"), _obj({"secret": {"type": "string", "pattern": "^lmsp_"}, "in_keyring": BOOL})]
        },
        "Pairing": pairing,
        "PairingList": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Pairing")}}),
        "PairingCreate": _obj({"app_name": NAME, "scopes": SCOPE_LIST}),
        "PairingCreated": {"allOf": [_ref("Pairing"), _obj({"poll_token": STR, "poll_url": STR})]},
        "PairingPoll": {
            "allOf": [
                _ref("Pairing"),
                {
                    "type": "object",
                    "properties": {
                        "token": {
                            "type": "string",
                            "pattern": "^lmsp_",
                            "description": "The new token's secret: present once, in the first poll after approval.",
                        }
                    },
                },
            ]
        },
    }
    schemas.update(event_schemas())
    schemas.update(downloads.schemas())
    return schemas


EVENTS = {
    "response.created": {"status": STR, "response": _ref("Response")},
    "response.output_item.added": {"output_index": INT, "item": _ref("OutputItem")},
    "response.content_part.added": {"item_id": STR, "output_index": INT, "content_index": INT, "part": {}},
    "response.output_text.delta": {"item_id": STR, "output_index": INT, "content_index": INT, "delta": STR},
    "response.output_text.done": {"item_id": STR, "output_index": INT, "content_index": INT, "text": STR},
    "response.content_part.done": {"item_id": STR, "output_index": INT, "content_index": INT, "part": {}},
    "response.reasoning_summary_text.delta": {"item_id": STR, "output_index": INT, "delta": STR},
    "response.reasoning_summary_text.done": {"item_id": STR, "output_index": INT, "text": STR},
    "response.function_call_arguments.delta": {"item_id": STR, "output_index": INT, "delta": STR},
    "response.function_call_arguments.done": {"item_id": STR, "output_index": INT, "arguments": STR},
    "response.output_item.done": {"output_index": INT, "item": _ref("OutputItem")},
    "response.completed": {"status": STR, "usage": _ref("Usage"), "response": _ref("Response")},
    "response.incomplete": {
        "status": STR,
        "incomplete_details": {"type": "object"},
        "usage": _ref("Usage"),
        "response": _ref("Response"),
    },
    "response.failed": {"status": STR, "error": _ref("Problem"), "response": _ref("Response")},
    "response.cancelled": {"status": STR, "response": _ref("Response")},
}


def event_name(event: str) -> str:
    return "Event_" + event.replace(".", "_")


def event_schemas() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for event, fields in EVENTS.items():
        out[event_name(event)] = _obj({"type": {"const": event}, "sequence_number": INT, "response_id": STR, **fields})
    out["Event_error"] = _obj({"type": {"const": "error"}, "sequence_number": INT, "error": _ref("Problem")})
    return out


def stream_description() -> str:
    names = ", ".join([*EVENTS, "error"])
    return (
        "With `stream: true`: server-sent events. Each event has an integer `id` (from 1), an `event` name "
        f"and JSON `data` (schemas `Event_*`); events: {names}. Exactly one terminal event ends the stream."
    )
