"""The OpenAI-compatible `/v1` in the OpenAPI document: its operations, bodies, answers and errors.

Why a module of its own: `/v1` (`http/openai/`) is a second API on the same port with
OpenAI's shapes — its request bodies are the pydantic models that validate them
(`ChatCompletionCreate`, `CompletionCreate`, `EmbeddingCreate`; for `/v1/responses`
the LMSP `ResponseCreate` with OpenAI's tools, items and defaults), its errors are
OpenAI's `{"error": {"message", "type", "param", "code"}}` (never problem documents),
and its streams are OpenAI's. Kept apart from `lmsp` (LMSP's own); `document` merges
`operations()` and `schemas()` in. The tokens and scopes
are the same as `/lmsp/v1`'s (`bearer`, `x-lmsp-scope`).
"""

from __future__ import annotations

import copy
from typing import Any

from lmsp_tray.http.openapi.parts import (
    BOOL,
    IDEMPOTENCY_KEY,
    INT,
    NUM,
    PROBLEMS,
    REF,
    REPLAYED_HEADER,
    STR,
    VERSION_HEADER,
    error_headers,
    nullable,
    obj,
    operation,
    path_param,
    ref,
)
from lmsp_tray.protocol.embeddings import MAX_INPUTS, EmbeddingCreate
from lmsp_tray.protocol.openai_chat import ChatCompletionCreate
from lmsp_tray.protocol.openai_chunks import error_type
from lmsp_tray.protocol.openai_completions import CompletionCreate
from lmsp_tray.protocol.openai_requests import HOSTED_ITEMS
from lmsp_tray.protocol.openai_shapes import MAX_INPUT_ITEMS_PAGE
from lmsp_tray.protocol.requests import ResponseCreate
from lmsp_tray.protocol.rerank import MAX_DOCUMENTS, RerankCreate

PREFIX = "V1"  # every /v1 schema is named V1…, apart from LMSP's (both have a `RefusalPart`, a `Model`…)
JSON = "application/json"
SSE = "text/event-stream"
TAG = "OpenAI-compatible /v1"


def _error(status: str) -> dict[str, Any]:
    return {
        "description": f"{PROBLEMS[status]} OpenAI's error object: the code is `error.code`, "
        f"`error.type` is `{error_type(int(status))}`.",
        "headers": error_headers(status),
        "content": {JSON: {"schema": ref(PREFIX + "Error")}},
    }


def _op(
    summary: str,
    scope: str,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[str, ...] = (),
) -> dict[str, Any]:
    """An operation of `/v1`: bearer token with `scope`; its errors in OpenAI's shape."""
    return operation(summary, scope, responses, body=body, params=params, problems=errors, error=_error, tags=[TAG])


def _json_data(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "string", "contentMediaType": JSON, "contentSchema": schema}


def _chunk_event(chunk: str) -> dict[str, Any]:
    """One event of a chunk stream: `data:` with a chunk or OpenAI's error object, or `[DONE]` last."""
    data = {"anyOf": [{"const": "[DONE]"}, _json_data({"anyOf": [ref(PREFIX + chunk), ref(PREFIX + "Error")]})]}
    return obj({"data": data})


def _response_event() -> dict[str, Any]:
    """One event of a Responses stream: its name, and its JSON with the same `type`."""
    return obj({"event": STR, "data": _json_data(obj({"type": STR, "sequence_number": INT}))})


def _ok(
    description: str,
    schema: dict[str, Any],
    stream: tuple[str, dict[str, Any]] | None = None,
    replayed: bool = False,
) -> dict[str, Any]:
    """A 200 answer; `stream`: the description of its event stream and the schema of one event."""
    content: dict[str, Any] = {JSON: {"schema": schema}}
    if stream is not None:
        content[SSE] = {"schema": {**stream[1], "description": stream[0]}}
    headers = {**VERSION_HEADER, **(REPLAYED_HEADER if replayed else {})}
    return {"description": description, "headers": headers, "content": content}


def _rerank(model: str) -> dict[str, Any]:
    """`/v1/rerank`, also served at `/rerank` as llama-server does."""
    example = {"model": model, "query": "What is a cat?", "documents": ["A cat is a small animal.", "The sky."]}
    return {
        "post": _op(
            'Rerank documents against a query, with a reranker (its `capabilities` are `["rerank"]`): '
            "the Jina/Cohere shape llama-server `--reranking` serves; `results` sorted by `relevance_score`, "
            "highest first (the reranker's raw logit, as llama.cpp reports it).",
            "responses:create",
            {"200": _ok("The documents' indices and scores, by relevance.", ref(PREFIX + "RerankList"))},
            body=_body(PREFIX + "RerankCreate", {"default": example, "top_n": {**example, "top_n": 1}}),
            errors=("404", "429", "503", "507"),
        )
    }


def _transcriptions() -> dict[str, Any]:
    """`/v1/audio/transcriptions`: OpenAI's multipart form, run as a chat turn with the audio."""
    form = obj(
        {
            "file": {
                "type": "string",
                "contentMediaType": "application/octet-stream",
                "description": "The audio: WAV, MP3 or FLAC, at most 25 MiB (and within max_request_bytes).",
            },
            "model": {
                **STR,
                "minLength": 1,
                "description": "A model that takes audio (`audio` in its `capabilities`).",
            },
        },
        {
            "prompt": {**STR, "description": 'The instruction; default "Transcribe audio to text" (llama-server\'s).'},
            "language": {**STR, "description": 'Added to the instruction as " (language: xx)".'},
            "response_format": {"enum": ["json", "text"], "default": "json"},
            "temperature": {**NUM, "minimum": 0, "maximum": 2, "default": 0},
            "max_tokens": {
                **INT,
                "minimum": 1,
                "description": "Not OpenAI's (llama-server's): a cap on the text's tokens.",
            },
        },
    )
    return {
        "post": _op(
            "Transcribe audio with a model whose projector has an audio encoder: the form becomes one user "
            "message (the instruction, then the audio) on that model, as llama-server builds it.",
            "responses:create",
            {
                "200": {
                    "description": "The text; as text/plain with `response_format=text`.",
                    "headers": VERSION_HEADER,
                    "content": {JSON: {"schema": ref(PREFIX + "Transcription")}, "text/plain": {"schema": STR}},
                }
            },
            body={"required": True, "content": {"multipart/form-data": {"schema": form}}},
            errors=("404", "413", "429", "503", "507"),
        )
    }


def _body(schema: str, examples: dict[str, Any]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {JSON: {"schema": ref(schema), "examples": {k: {"value": v} for k, v in examples.items()}}},
    }


CHUNK_STREAM = (
    "With `stream: true`: server-sent events as OpenAI sends them (this schema is one event) — each a bare "
    "`data:` line holding a "
    "`{object}` object (schema `{schema}`), the last chunk with `usage` when `stream_options.include_usage` "
    "is true, then `data: [DONE]`. A failure after the first byte is a `data:` line with OpenAI's error "
    "object (schema `V1Error`), then `data: [DONE]`."
)
RESPONSE_STREAM = (
    "With `stream: true`: OpenAI's Responses events (this schema is one event), each an `event:` line with its "
    "name and a `data:` line with its JSON (`type`, `sequence_number` from 0, …): the events of a /lmsp/v1 "
    "stream (response.created, response.output_item.added, response.output_text.delta, …; a custom tool's "
    "input as response.custom_tool_call_input.delta/done) in OpenAI's shape, then exactly one terminal event: "
    "response.completed, response.incomplete, response.failed, response.cancelled, or error."
)
GENERATION_ERRORS = ("404", "409", "422", "429", "503", "507")


def operations(model: str) -> dict[str, dict[str, Any]]:
    """The `/v1` paths; `model` (an available model id) makes the examples runnable."""
    model_param = path_param("model_id", "A model id from GET /v1/models.", model)
    response_param = path_param("response_id", "A response id (resp_…) stored with `store` (the default).")
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    completion = {"model": model, "prompt": "def hello():\n    return ", "max_tokens": 8, "temperature": 0}
    response = {"model": model, "input": "Say hello.", "max_output_tokens": 8, "temperature": 0}
    return {
        "/v1/models": {
            "get": _op(
                "List the models (OpenAI's model objects, with `context_length` and `capabilities`).",
                "models:read",
                {"200": _ok("The models.", ref(PREFIX + "ModelList"))},
            )
        },
        "/v1/models/{model_id}": {
            "get": _op(
                "One model.",
                "models:read",
                {"200": _ok("The model.", ref(PREFIX + "Model"))},
                params=[model_param],
                errors=("404",),
            )
        },
        "/v1/chat/completions": {
            "post": _op(
                "Chat completion (OpenAI's Chat Completions), sync or streamed.",
                "responses:create",
                {
                    "200": _ok(
                        "The chat completion; or, with `stream: true`, its chunks.",
                        ref(PREFIX + "ChatCompletion"),
                        (
                            CHUNK_STREAM.format(object="chat.completion.chunk", schema="V1ChatCompletionChunk"),
                            _chunk_event("ChatCompletionChunk"),
                        ),
                        replayed=True,
                    )
                },
                body=_body(PREFIX + "ChatCompletionCreate", {"default": chat, "stream": {**chat, "stream": True}}),
                params=[IDEMPOTENCY_KEY],
                errors=GENERATION_ERRORS,
            )
        },
        "/v1/completions": {
            "post": _op(
                "Text completion (OpenAI's legacy Completions): continue `prompt`, or fill in the middle "
                "between `prompt` and `suffix` with a model whose listing shows `fill_in_the_middle`.",
                "responses:create",
                {
                    "200": _ok(
                        "The text completion; or, with `stream: true`, its chunks.",
                        ref(PREFIX + "TextCompletion"),
                        (
                            CHUNK_STREAM.format(object="text_completion", schema="V1TextCompletionChunk"),
                            _chunk_event("TextCompletionChunk"),
                        ),
                        replayed=True,
                    )
                },
                body=_body(
                    PREFIX + "CompletionCreate",
                    {
                        "default": completion,
                        "stream": {**completion, "stream": True},
                        "fill_in_the_middle": {**completion, "suffix": "\n\nprint(hello())\n"},
                    },
                ),
                params=[IDEMPOTENCY_KEY],
                errors=GENERATION_ERRORS,
            )
        },
        "/v1/embeddings": {
            "post": _op(
                'Embeddings, with an embedding model (its `capabilities` are `["embeddings"]`).',
                "responses:create",
                {"200": _ok("The vectors.", ref(PREFIX + "EmbeddingList"))},
                body=_body(PREFIX + "EmbeddingCreate", {"default": {"model": model, "input": ["Say hello."]}}),
                errors=("404", "429", "503", "507"),
            )
        },
        "/v1/rerank": _rerank(model),
        "/rerank": _rerank(model),
        "/v1/audio/transcriptions": _transcriptions(),
        "/v1/responses": {
            "post": _op(
                "Generate a response (OpenAI's Responses API; stored by default), sync or streamed.",
                "responses:create",
                {
                    "200": _ok(
                        "The response object; or, with `stream: true`, its events.",
                        ref(PREFIX + "Response"),
                        (RESPONSE_STREAM, _response_event()),
                        replayed=True,
                    )
                },
                body=_body(PREFIX + "ResponseCreate", {"default": response, "stream": {**response, "stream": True}}),
                params=[IDEMPOTENCY_KEY],
                errors=(*GENERATION_ERRORS, "410"),
            )
        },
        "/v1/responses/{response_id}": {
            "get": _op(
                "A stored response.",
                "responses:read",
                {"200": _ok("The response.", ref(PREFIX + "Response"))},
                params=[response_param],
                errors=("404", "503"),
            ),
            "delete": _op(
                "Delete a stored response.",
                "responses:create",
                {"200": _ok("Deleted.", ref(PREFIX + "ResponseDeleted"))},
                params=[response_param],
                errors=("404", "503"),
            ),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": _op(
                "The input items of a stored response, a page at a time.",
                "responses:read",
                {"200": _ok("A page of input items.", ref(PREFIX + "InputItemList"))},
                params=[
                    response_param,
                    {
                        "name": "order",
                        "in": "query",
                        "required": False,
                        "schema": {"enum": ["asc", "desc"], "default": "desc"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_INPUT_ITEMS_PAGE, "default": 20},
                    },
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "description": "The last item id of the previous page.",
                        "schema": STR,
                    },
                ],
                errors=("400", "404", "503"),
            )
        },
    }


def _pydantic(model: Any, name: str) -> dict[str, Any]:
    """`name` and the shapes it uses, from a pydantic model, each under the V1 prefix."""
    schema = model.model_json_schema(by_alias=True, ref_template=REF + PREFIX + "{model}")
    defs = schema.pop("$defs", {})
    return {PREFIX + name: schema, **{PREFIX + k: v for k, v in defs.items()}}


def _response_create() -> dict[str, Any]:
    """LMSP's `ResponseCreate`, as `/v1/responses` takes it: OpenAI's tools, tool choices, items, defaults."""
    out = _pydantic(ResponseCreate, "ResponseCreate")
    body = copy.deepcopy(out[PREFIX + "ResponseCreate"])
    props = body["properties"]
    props["input"] = {
        "anyOf": [
            {"type": "string"},
            {
                "type": "array",
                "items": {"type": "object"},
                "description": "Message, function_call, function_call_output, reasoning, custom_tool_call and "
                "custom_tool_call_output items; items of hosted tools (" + ", ".join(sorted(HOSTED_ITEMS)) + ") "
                "are left out of the context; `item_reference` is refused.",
            },
        ]
    }
    props["tools"] = nullable(
        {
            "type": "array",
            "items": obj({"type": STR}),
            "description": "`function` tools; `namespace` (a group of functions, offered as "
            "`<namespace>__<name>`); `custom` with a plain-text format; hosted tools (`web_search`, "
            "`file_search`, `mcp`, …) are left out and named in `extensions.lmsp_tray.tools_left_out`.",
        }
    )
    props["tool_choice"] = nullable(
        {
            "anyOf": [
                {"enum": ["auto", "none", "required"]},
                obj({"type": STR}),
            ],
            "description": "As OpenAI: a mode, a named function or custom tool, or `allowed_tools`; forcing a "
            "hosted tool is refused.",
        }
    )
    props["store"] = {"type": "boolean", "default": True}
    props["background"] = {"anyOf": [{"const": False}, {"type": "null"}], "description": "Not supported here."}
    body["title"] = "V1ResponseCreate"
    out[PREFIX + "ResponseCreate"] = body
    return out


def schemas() -> dict[str, Any]:
    """The `/v1` shapes, all named V1…."""
    usage = nullable(obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT}))
    error = obj({"message": STR, "type": STR, "param": nullable(STR), "code": nullable(STR)})
    common = {"id": STR, "created": INT, "model": STR}
    chat_choice = obj(
        {
            "index": INT,
            "message": obj({"role": {"const": "assistant"}, "content": nullable(STR)}),
            "finish_reason": STR,
        },
        {"logprobs": nullable({"type": "object"})},
    )
    text_choice = obj({"text": STR, "index": INT, "finish_reason": STR}, {"logprobs": nullable({"type": "object"})})
    text_chunk_choice = obj(
        {"text": STR, "index": INT, "finish_reason": nullable(STR)}, {"logprobs": nullable({"type": "object"})}
    )
    items = {"type": "array", "items": obj({"type": STR})}
    return {
        **_pydantic(ChatCompletionCreate, "ChatCompletionCreate"),
        **_pydantic(CompletionCreate, "CompletionCreate"),
        **_pydantic(EmbeddingCreate, "EmbeddingCreate"),
        **_pydantic(RerankCreate, "RerankCreate"),
        **_response_create(),
        PREFIX + "Error": obj({"error": error}),
        PREFIX + "Transcription": obj(
            {"text": STR},
            {
                "usage": obj(
                    {"type": {"const": "tokens"}, "input_tokens": INT, "output_tokens": INT, "total_tokens": INT}
                )
            },
        ),
        PREFIX + "Model": obj(
            {"id": STR, "object": {"const": "model"}, "created": INT, "owned_by": STR},
            {
                "context_length": nullable(INT),
                "capabilities": {
                    "type": "array",
                    "items": STR,
                    "description": "Not OpenAI's: LMSP's capabilities of the model (text, streaming, tools, "
                    "structured_output, reasoning, or embeddings or rerank alone), and `fill_in_the_middle` when "
                    "/v1/completions can fill in between `prompt` and `suffix`; `vision` when the model takes images "
                    "and `audio` when it takes audio (it has a projector).",
                },
            },
        ),
        PREFIX + "ModelList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("V1Model")}}),
        PREFIX + "ChatCompletion": obj(
            {
                **common,
                "object": {"const": "chat.completion"},
                "choices": {"type": "array", "items": chat_choice},
                "usage": usage,
            }
        ),
        PREFIX + "ChatCompletionChunk": obj(
            {**common, "object": {"const": "chat.completion.chunk"}, "choices": {"type": "array"}},
            {"usage": usage},
        ),
        PREFIX + "TextCompletion": obj(
            {
                **common,
                "object": {"const": "text_completion"},
                "choices": {"type": "array", "items": text_choice},
                "usage": usage,
            }
        ),
        PREFIX + "TextCompletionChunk": obj(
            {
                **common,
                "object": {"const": "text_completion"},
                "choices": {"type": "array", "items": text_chunk_choice},
            },
            {"usage": usage},
        ),
        PREFIX + "EmbeddingList": obj(
            {
                "object": {"const": "list"},
                "data": {
                    "type": "array",
                    "maxItems": MAX_INPUTS,
                    "items": obj(
                        {
                            "object": {"const": "embedding"},
                            "index": INT,
                            "embedding": {
                                "anyOf": [
                                    {"type": "array", "items": NUM},
                                    {"type": "string", "description": "base64 of little-endian float32"},
                                ]
                            },
                        }
                    ),
                },
                "model": STR,
                "usage": obj({"prompt_tokens": INT, "total_tokens": INT}),
            }
        ),
        PREFIX + "RerankList": obj(
            {
                "object": {"const": "list"},
                "model": STR,
                "results": {
                    "type": "array",
                    "maxItems": MAX_DOCUMENTS,
                    "items": obj({"index": INT, "relevance_score": NUM}, {"document": obj({"text": STR})}),
                },
                "usage": obj({"prompt_tokens": INT, "total_tokens": INT}),
            }
        ),
        PREFIX + "Response": obj(
            {
                "id": STR,
                "object": {"const": "response"},
                "created_at": INT,
                "status": {"enum": ["in_progress", "completed", "incomplete", "failed", "cancelled"]},
                "model": STR,
                "output": items,
                "error": nullable(obj({"code": STR, "message": STR})),
            },
            {"usage": nullable({"type": "object"}), "store": BOOL, "tools": {"type": "array"}},
        ),
        PREFIX + "ResponseDeleted": obj({"id": STR, "object": {"const": "response"}, "deleted": {"const": True}}),
        PREFIX + "InputItemList": obj(
            {
                "object": {"const": "list"},
                "data": items,
                "first_id": nullable(STR),
                "last_id": nullable(STR),
                "has_more": BOOL,
            }
        ),
    }
