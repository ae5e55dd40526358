"""LMSP's `components.schemas` in the OpenAPI document: its response, request and event shapes.

Why a module of its own: `lmsp` describes LMSP's paths and operations; the shapes they refer to
(`$ref`) are a separate, long list that changes when a wire object changes, not when an endpoint
does. The response events are listed once here (`EVENTS`): their schemas, the stream
descriptions and the `x-lmsp-events` maps of the operations are all built from that list.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.auth.tokens import MAX_NAME, NAME_PATTERN, SCOPES
from lmsp_tray.http.openapi.parts import BOOL, INT, REF, STR, event_schema_name, nullable, obj, ref
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
    """LMSP's shapes, its response events' included (the console's, downloads' and /v1's are their own)."""
    request = ResponseCreate.model_json_schema(by_alias=True, ref_template=REF + "{model}")
    defs = request.pop("$defs", {})
    problem = obj(
        {"type": STR, "title": STR, "status": INT, "detail": STR, "code": STR}, {"param": STR, "message": STR}
    )
    item = {
        "type": "object",
        "required": ["id", "type"],
        "properties": {"id": STR, "type": {"enum": ["message", "function_call", "reasoning"]}},
    }
    usage = obj(
        {"input_tokens": INT, "output_tokens": INT, "total_tokens": INT},
        {"input_tokens_details": obj({"cached_tokens": INT})},
    )
    status = {"enum": ["in_progress", "completed", "incomplete", "failed", "cancelled"]}
    response = obj(
        {
            "id": STR,
            "object": {"const": "response"},
            "created_at": INT,
            "status": status,
            "model": STR,
            "output": {"type": "array", "items": ref("OutputItem")},
            "usage": nullable(ref("Usage")),
            "error": nullable(ref("Problem")),
            "incomplete_details": nullable(obj({"reason": STR})),
        }
    )
    model = obj(
        {
            "id": STR,
            "object": {"const": "model"},
            "architecture": nullable(STR),
            "parameters": nullable(STR),
            "quantization": nullable(STR),
            "context_length": INT,
            "size_bytes": INT,
            "capabilities": {"type": "array", "items": STR},
            "state": {"enum": ["available", "loading", "loaded", "unloading", "error"]},
            "source": STR,
            "error": nullable(ref("Problem")),
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
                            },
                            "input_modalities": {
                                "type": "array",
                                "items": {"enum": ["text", "image", "audio"]},
                                "description": "What the model reads: `text`, plus `image` (and `audio`) when an "
                                "`mmproj` projector was found beside it (same folder, or its Ollama manifest); "
                                "`text` alone while it is loaded without its projector (`projector_skipped`).",
                            },
                            "projector_skipped": {
                                **STR,
                                "description": "Loaded models, only when loaded without their projector: why (it "
                                "did not fit in the memory budget beside the model, or llama.cpp could not load it). "
                                "The model takes text only until it is loaded again; an image is `400 "
                                "unsupported_capability` saying so.",
                            },
                            "draft_model": {
                                **STR,
                                "description": "Loaded models, only when a draft model drafts for them (the "
                                "`draft` setting): its id. Its guesses are counted in `/metrics`.",
                            },
                            "draft_skipped": {
                                **STR,
                                "description": "Loaded models, only when their `draft` setting names a draft model "
                                "they run without: why (not found, another vocabulary, no room in the memory "
                                "budget, speculative decoding off).",
                            },
                            "projector": {
                                "type": "object",
                                "description": "The projector file paired with the model.",
                                "properties": {"file_name": STR, "size_bytes": INT},
                            },
                            "settings": {
                                **ref("ModelSettings"),
                                "description": "GET /models/{id}: the model's own settings (null: unset).",
                            },
                            "trained_context_length": {
                                **nullable(INT),
                                "description": "The window the model was trained for (its GGUF header): "
                                "`context_length` never exceeds it.",
                            },
                            "device": {
                                "enum": ["cpu", "gpu"],
                                "description": "Loaded models: where its layers run (`gpu`: some or all).",
                            },
                            "gpu_layers": {**INT, "description": "Loaded models: layers offloaded to the GPU."},
                            "total_layers": {**INT, "description": "Loaded models: the model's layers."},
                            "gpu_fallback": {
                                **STR,
                                "description": "Loaded models, only when the GPU ran out of memory at load: "
                                "what failed and how many layers run on the GPU instead (fewer, or none).",
                            },
                            "devices": {
                                "type": "array",
                                "description": "Loaded models: its memory on each device, estimated from its "
                                "load plan (the CPU first, then the GPUs it uses).",
                                "items": obj({"name": STR, "type": STR, "memory_bytes": INT}),
                            },
                        },
                    }
                },
            }
        },
    )
    token = obj(
        {
            "id": STR,
            "object": {"const": "token"},
            "name": STR,
            "scopes": {"type": "array", "items": SCOPE},
            "created_at": INT,
            "last_used_at": nullable(INT),
            "revoked_at": nullable(INT),
            "owner": BOOL,
        }
    )
    pairing = obj(
        {
            "id": STR,
            "object": {"const": "pairing"},
            "app_name": STR,
            "scopes": {"type": "array", "items": SCOPE},
            "user_code": STR,
            "status": {"enum": ["pending", "approved", "denied", "expired"]},
            "created_at": INT,
            "expires_at": INT,
            "token_id": nullable(STR),
        }
    )
    schemas: dict[str, Any] = {
        **defs,
        "ResponseCreate": request,
        "Problem": problem,
        "Usage": usage,
        "OutputItem": item,
        "Response": response,
        "Model": model,
        "ModelList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}}),
        "ServiceDocument": obj(
            {
                "object": {"const": "service"},
                "lmsp_version": STR,
                "versions": {"type": "array", "items": STR},
                "service": obj({"name": STR, "version": STR}),
                "capabilities": {"type": "array", "items": STR},
                "auth": obj({"type": {"const": "bearer"}, "scopes": {"type": "array", "items": STR}}),
                "limits": {"type": "object"},
            },
            {
                "extensions": obj(
                    {
                        "lmsp_tray": obj(
                            {
                                "backend": {
                                    **STR,
                                    "description": "The backend llama.cpp was built with: `cpu` (none), "
                                    "`vulkan`, `cuda`, `metal`, ...",
                                },
                                "gpu_offload": {**BOOL, "description": "Whether the build can offload layers."},
                                "devices": {
                                    "type": "array",
                                    "description": "The devices llama.cpp sees (its device registry), probed "
                                    "when the service started; free memory is as it was then.",
                                    "items": ref("Device"),
                                },
                            },
                            {
                                "device_error": {
                                    **STR,
                                    "description": "Why the devices could not be probed (models then run on the CPU).",
                                },
                                "gpu": {
                                    "const": "off",
                                    "description": "Present while the `gpu` setting is off: models run on the "
                                    "CPU whatever the devices.",
                                },
                            },
                        )
                    }
                )
            },
        ),
        "Device": obj(
            {
                "name": STR,
                "description": STR,
                "type": {"enum": ["cpu", "gpu", "igpu", "accel"]},
                "backend": STR,
                "memory_total_bytes": INT,
                "memory_free_bytes": INT,
            }
        ),
        "ResponseDeleted": obj({"id": STR, "object": {"const": "response.deleted"}, "deleted": {"const": True}}),
        "Task": obj(
            {
                "id": STR,
                "object": {"const": "task"},
                "status": {"enum": list(TASK_STATUSES)},
                "created_at": INT,
                "updated_at": INT,
                "response_id": nullable(STR),
                "response": nullable(ref("Response")),
                "error": nullable(ref("Problem")),
            },
            {
                "kind": {
                    "const": "model.download",
                    "description": "Only on tasks that are not background responses: a model download.",
                },
                "download": nullable(ref("ModelDownload")),
            },
        ),
        "TaskList": obj(
            {
                "object": {"const": "list"},
                "data": {"type": "array", "items": ref("Task")},
                "first_id": nullable(STR),
                "last_id": nullable(STR),
                "has_more": BOOL,
            }
        ),
        "Token": token,
        "TokenList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("Token")}}),
        "TokenCreate": obj({"name": NAME, "scopes": SCOPE_LIST}),
        "TokenCreated": {
            "allOf": [ref("Token"), obj({"secret": {"type": "string", "pattern": "^lmsp_"}, "in_keyring": BOOL})]
        },
        "Pairing": pairing,
        "PairingList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("Pairing")}}),
        "PairingCreate": obj({"app_name": NAME, "scopes": SCOPE_LIST}),
        "PairingCreated": {"allOf": [ref("Pairing"), obj({"poll_token": STR, "poll_url": STR})]},
        "PairingPoll": {
            "allOf": [
                ref("Pairing"),
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
    return schemas


EVENTS = {
    "response.created": {"status": STR, "response": ref("Response")},
    "response.output_item.added": {"output_index": INT, "item": ref("OutputItem")},
    "response.content_part.added": {"item_id": STR, "output_index": INT, "content_index": INT, "part": {}},
    "response.output_text.delta": {"item_id": STR, "output_index": INT, "content_index": INT, "delta": STR},
    "response.output_text.done": {"item_id": STR, "output_index": INT, "content_index": INT, "text": STR},
    "response.content_part.done": {"item_id": STR, "output_index": INT, "content_index": INT, "part": {}},
    "response.reasoning_summary_text.delta": {"item_id": STR, "output_index": INT, "delta": STR},
    "response.reasoning_summary_text.done": {"item_id": STR, "output_index": INT, "text": STR},
    "response.function_call_arguments.delta": {"item_id": STR, "output_index": INT, "delta": STR},
    "response.function_call_arguments.done": {"item_id": STR, "output_index": INT, "arguments": STR},
    "response.output_item.done": {"output_index": INT, "item": ref("OutputItem")},
    "response.completed": {"status": STR, "usage": ref("Usage"), "response": ref("Response")},
    "response.incomplete": {
        "status": STR,
        "incomplete_details": {"type": "object"},
        "usage": ref("Usage"),
        "response": ref("Response"),
    },
    "response.failed": {"status": STR, "error": ref("Problem"), "response": ref("Response")},
    "response.cancelled": {"status": STR, "response": ref("Response")},
}


def event_schemas() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for event, fields in EVENTS.items():
        out[event_schema_name(event)] = obj(
            {"type": {"const": event}, "sequence_number": INT, "response_id": STR, **fields}
        )
    out["Event_error"] = obj({"type": {"const": "error"}, "sequence_number": INT, "error": ref("Problem")})
    return out


def stream_description() -> str:
    names = ", ".join([*EVENTS, "error"])
    return (
        "With `stream: true`: server-sent events. Each event has an integer `id` (from 1), an `event` name "
        f"and JSON `data` (schemas `Event_*`); events: {names}. Exactly one terminal event ends the stream."
    )
