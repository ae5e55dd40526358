"""The tokenizer endpoints in the OpenAPI document: `/lmsp/v1/models/{id}/tokenize`, `/detokenize` and
`/apply-template` (`http/tokenize_routes.py`), their bodies being the pydantic models that validate them.

Why a module of its own: one module per API surface (`document` merges `operations()` and `schemas()`).
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.openapi.parts import (
    INT,
    REF,
    STR,
    json_answer,
    json_body,
    obj,
    operation,
    path_param,
    ref,
)
from lmsp_tray.protocol.tokenize import ApplyTemplateCreate, DetokenizeCreate, TokenizeCreate


def _pydantic(model: Any, name: str) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, ref_template=REF + "{model}")
    defs = schema.pop("$defs", {})
    schema["title"] = name
    return {name: schema, **defs}


def schemas() -> dict[str, Any]:
    piece = obj({"id": INT, "piece": {"anyOf": [STR, {"type": "array", "items": INT}]}})
    return {
        **_pydantic(TokenizeCreate, "TokenizeCreate"),
        **_pydantic(DetokenizeCreate, "DetokenizeCreate"),
        **_pydantic(ApplyTemplateCreate, "ApplyTemplateCreate"),
        "Tokens": obj(
            {
                "object": {"const": "tokens"},
                "model": STR,
                "tokens": {"type": "array", "items": {"anyOf": [INT, piece]}},
                "count": INT,
            }
        ),
        "DetokenizedText": obj({"object": {"const": "text"}, "model": STR, "content": STR}),
        "TemplatePrompt": obj({"object": {"const": "prompt"}, "model": STR, "prompt": STR}),
    }


def operations(model: str) -> dict[str, dict[str, Any]]:
    model_param = path_param("model_id", "A model id from GET /models (loaded on demand).", model)

    def op(summary: str, answer: str, schema: str, body: Any) -> dict[str, Any]:
        return {
            "post": operation(
                summary,
                "responses:create",
                {"200": json_answer(answer, ref(schema))},
                body=body,
                params=[model_param],
                problems=("400", "404", "429", "503", "507"),
            )
        }

    return {
        "/lmsp/v1/models/{model_id}/tokenize": op(
            "The model's tokens for a text, by its own tokenizer (llama-server's /tokenize fields: `content`, "
            "`add_special`, `parse_special`, `with_pieces`).",
            "The tokens (each `{id, piece}` with `with_pieces`).",
            "Tokens",
            json_body(ref("TokenizeCreate"), {"content": "Hello, world!", "with_pieces": True}),
        ),
        "/lmsp/v1/models/{model_id}/detokenize": op(
            "The text of tokens (special tokens written out), as llama-server's /detokenize.",
            "The text.",
            "DetokenizedText",
            json_body(ref("DetokenizeCreate"), {"tokens": [1, 2, 3]}),
        ),
        "/lmsp/v1/models/{model_id}/apply-template": op(
            "The model's chat template applied to messages without generating: the prompt a response reads.",
            "The prompt text (without the start token tokenizing adds).",
            "TemplatePrompt",
            json_body(ref("ApplyTemplateCreate"), {"messages": [{"role": "user", "content": "Say hello."}]}),
        ),
    }
