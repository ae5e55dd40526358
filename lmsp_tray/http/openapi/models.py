"""The OpenAPI description of model management beyond loading: a model's own settings, deleting one.

A surface of its own (`lmsp` puts its paths among LMSP's), next to the routes in
`http.model_routes`: the settings body and the settings member a model object carries.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.config import MODEL_SETTING_KEYS
from lmsp_tray.http.openapi.parts import BOOL, INT, NUM, STR, json_answer, json_body, nullable, obj, operation, ref

SETTING_SCHEMAS: dict[str, dict[str, Any]] = {
    "context": {**INT, "minimum": 1, "description": "The window cap for this model (as `context_cap`)."},
    "keep_alive": {
        "anyOf": [NUM, {**STR, "pattern": r"^(-?\d+(\.\d+)?(ms|s|m|h|d)?|never|forever)$"}],
        "description": 'Idle time before unloading: seconds or "30s", "5m", "1h"; "never".',
    },
    "parallel": {**INT, "minimum": 1, "description": "Sequences decoded together."},
    "gpu_layers": {**INT, "minimum": 0, "description": "Layers offloaded to the GPU."},
    "speculative": {**BOOL, "description": "Speculative decoding from prompt lookup."},
    "temperature": {**NUM, "minimum": 0, "maximum": 2},
    "top_k": {**INT, "minimum": 0},
    "top_p": {**NUM, "minimum": 0, "maximum": 1},
    "min_p": {**NUM, "minimum": 0, "maximum": 1},
    "repeat_penalty": {**NUM, "exclusiveMinimum": 0, "maximum": 10},
    "system_prompt": {**STR, "description": "A system message for requests that send none."},
    "draft": {
        **STR,
        "minLength": 1,
        "description": "A smaller model of the same vocabulary that drafts tokens for this one where prompt lookup proposes none (from its next load).",
    },
}
assert tuple(SETTING_SCHEMAS) == MODEL_SETTING_KEYS


def schemas() -> dict[str, Any]:
    change = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {key: nullable(schema) for key, schema in SETTING_SCHEMAS.items()},
        "description": "The settings to change; null removes one (the service-wide setting applies again).",
    }
    shown = obj(
        {
            "values": obj({key: nullable(schema) for key, schema in SETTING_SCHEMAS.items()}),
            "applies": {
                "type": "object",
                "description": "When each takes effect: `next_load` (the model's next load) or `next_request`.",
                "additionalProperties": {"enum": ["next_load", "next_request"]},
            },
        }
    )
    deleted = obj(
        {
            "id": STR,
            "object": {"const": "model"},
            "deleted": {"const": True},
            "files": {"type": "array", "items": STR},
            "freed_bytes": INT,
        }
    )
    found = obj(
        {
            "repository": STR,
            "downloads": nullable(INT),
            "likes": nullable(INT),
            "updated_at": nullable(STR),
            "model": {**STR, "description": "What POST /models/pull takes to download its default variant."},
        }
    )
    variant = obj(
        {
            "label": STR,
            "quantization": nullable(STR),
            "size_bytes": INT,
            "files": {"type": "array", "items": STR},
            "runnable": BOOL,
            "model": {**STR, "description": "What POST /models/pull takes to download this variant."},
            "fit": nullable(ref("MemoryFit")),
        }
    )
    variants = obj(
        {
            "repository": STR,
            "projector": nullable({**STR, "description": "The vision projector a pull fetches with it."}),
            "default": nullable(STR),
            "variants": {"type": "array", "items": ref("HubVariant")},
        }
    )
    return {
        "ModelSettingsChange": change,
        "ModelSettings": shown,
        "ModelDeleted": deleted,
        "HubModel": found,
        "HubModelList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("HubModel")}}),
        "HubVariant": variant,
        "HubVariants": variants,
    }


def operations(model_param: dict[str, Any]) -> dict[str, Any]:
    force = {
        "name": "force",
        "in": "query",
        "required": False,
        "description": "Delete even while the model generates (its running requests end).",
        "schema": {"enum": ["true", "false"]},
    }
    return {
        "/lmsp/v1/models/{model_id}": {
            "delete": operation(
                "Delete a model's files: only those the service owns (its models folder, and what it downloaded "
                "into the Hugging Face cache, removed as huggingface_hub removes a revision); another app's "
                "files are refused (409, saying whose and where). A loaded model is unloaded first; one "
                "generating is refused (409) unless `force=true`.",
                "models:manage",
                {"200": json_answer("What was deleted.", ref("ModelDeleted"))},
                params=[model_param, force],
                problems=("400", "404", "409", "503"),
            )
        },
        "/lmsp/v1/hub/models": {
            "get": operation(
                "Search Hugging Face for GGUF repositories (huggingface_hub's own search: HF_ENDPOINT and the "
                "user's token apply), most downloaded first; answers are cached for a few minutes.",
                "models:manage",
                {"200": json_answer("The repositories found.", ref("HubModelList"))},
                params=[
                    {
                        "name": "search",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "\\S"},
                    }
                ],
                problems=("400", "502", "503"),
            )
        },
        "/lmsp/v1/hub/variants": {
            "get": operation(
                "One repository's GGUF variants: size, whether each fits this machine (the rules pull uses), "
                "and its vision projector; cached for a few minutes.",
                "models:manage",
                {"200": json_answer("The variants.", ref("HubVariants"))},
                params=[
                    {
                        "name": "repository",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^[^/]+/[^/]+$", "maxLength": 200},
                    }
                ],
                problems=("400", "401", "403", "404", "502", "503"),
            )
        },
        "/lmsp/v1/models/{model_id}/settings": {
            "patch": operation(
                'Change a model\'s own settings (`[models."<id>"]` in config.toml). Load settings (context, '
                "keep_alive, parallel, gpu_layers, speculative) apply at the model's next load; the default "
                "sampling and system prompt to the next request that does not set its own.",
                "models:manage",
                {"200": json_answer("The model, its settings in extensions.lmsp_tray.settings.", ref("Model"))},
                body=json_body(ref("ModelSettingsChange"), {"temperature": 0.2, "context": 8192}),
                params=[model_param],
                problems=("404", "409", "503"),
            )
        },
    }
