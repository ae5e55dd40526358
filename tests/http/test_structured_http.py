"""Structured output and reasoning over HTTP, real llama.cpp on generated models.

Every schema below exercises enforced keywords; each output (sync and
streamed, several seeds) must parse and validate with `jsonschema`. Schema
features that cannot be enforced are refused with a 400 naming the keyword.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from tools_support import (  # noqa: F401  (pytest fixtures shared by the tool tests)
    FORMAT_CHECKER,
    LLAMA_ID,
    PLAIN_ID,
    QWEN_ID,
    R1_ID,
    check_stream,
    client,
    live_config,
    live_files,
    output_of,
    seeded,
    stream,
)

SCHEMAS: dict[str, dict[str, Any]] = {
    "object-required": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "format": "uuid"},
                    "lines": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 3,
                        "items": {
                            "type": "object",
                            "properties": {
                                "sku": {"type": "string", "minLength": 3, "maxLength": 6},
                                "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                            },
                            "required": ["sku", "qty"],
                        },
                    },
                },
                "required": ["id", "lines"],
            },
        },
        "required": ["order"],
    },
    "array-bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 2,
        "maxItems": 5,
    },
    "enum-const": {
        "type": "object",
        "properties": {
            "kind": {"const": "reading"},
            "level": {"enum": ["low", "mid", "high", 3, None]},
            "ok": {"type": "boolean"},
        },
        "required": ["kind", "level", "ok"],
    },
    "number-bounds": {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "temp": {"type": "number", "exclusiveMinimum": -40, "exclusiveMaximum": 60},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "delta": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3},
            "big": {"type": "integer", "minimum": 12345},
        },
        "required": ["ratio", "temp", "year", "delta", "big"],
    },
    "string-lengths": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 4, "maxLength": 4},
            "note": {"type": "string", "maxLength": 3},
            "title": {"type": "string", "minLength": 2},
        },
        "required": ["code", "note", "title"],
    },
    "formats": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "clock": {"type": "string", "format": "time"},
            "host": {"type": "string", "format": "hostname"},
            "ip": {"type": "string", "format": "ipv4"},
            "url": {"type": "string", "format": "uri"},
        },
        "required": ["day", "at", "clock", "host", "ip", "url"],
    },
    "anyof-nullable": {
        "type": "object",
        "properties": {
            "value": {
                "anyOf": [
                    {"type": "integer", "minimum": 10, "maximum": 20},
                    {"type": "string", "maxLength": 2},
                    {"type": "null"},
                ]
            },
            "maybe": {"type": ["boolean", "null"]},
        },
        "required": ["value", "maybe"],
    },
    "refs-defs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"],
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "label": {"enum": ["a", "b", "c"]},
                    "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["label"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "oneof-tagged": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"shape": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 5}},
                "required": ["shape", "r"],
            },
            {
                "type": "object",
                "properties": {"shape": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["shape", "side"],
            },
        ],
    },
    "tuple-map": {
        "type": "object",
        "properties": {
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}],
                "items": False,
            },
            "scores": {
                "type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
                "maxProperties": 3,
            },
        },
        "required": ["pair", "scores"],
    },
    "patterns": {  # pydantic's constrained strings send these
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "slug": {"type": "string", "pattern": "^[a-z0-9]{1,8}(?:-[a-z0-9]{1,8}){0,2}$", "maxLength": 26},
            "quoted": {"type": "string", "pattern": '^"[^"\\\\]{0,6}"$'},
            "choice": {"type": "string", "pattern": "^(yes|no|maybe)\\.?$"},
            "anything": {"type": "string", "pattern": "^.{0,5}\\s\\w{1,6}?$"},
            "hex": {"type": "string", "pattern": "^0x[\\dA-Fa-f]{2,4}$", "minLength": 4},
        },
        "required": ["code", "slug", "quoted", "choice", "anything", "hex"],
        "additionalProperties": False,
    },
}


def structured(model: str, schema: dict[str, Any], seed: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "input": "Fill in the record.",
        "temperature": 1.0,
        "max_output_tokens": 400,
        "response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}},
        "extensions": seeded(seed),
        **extra,
    }


def answer_json(doc: dict[str, Any]) -> Any:
    [message] = list(output_of("message", doc))
    return json.loads(message["content"][0]["text"])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_structured_output_validates_sync_and_stream(client: httpx.Client, name: str) -> None:
    schema = SCHEMAS[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    for seed in range(3):
        doc = client.post("/responses", json=structured(PLAIN_ID, schema, seed)).json()
        assert doc["status"] == "completed", doc
        jsonschema.validate(answer_json(doc), schema, format_checker=FORMAT_CHECKER)
    final = check_stream(stream(client, structured(PLAIN_ID, schema, 11)))
    assert final["status"] == "completed"
    jsonschema.validate(answer_json(final), schema, format_checker=FORMAT_CHECKER)


def test_line_separator_characters_stay_inside_their_event(client: httpx.Client) -> None:
    """A model that writes U+0085, U+2028 or U+2029 must not cut an SSE data line for clients that
    split lines the way `str.splitlines()` does (httpx's `iter_lines`, used by `stream` here)."""
    value = "a\u2028b\u0085c\u2029d"
    schema = {"type": "object", "properties": {"v": {"const": value}}, "required": ["v"]}
    with client.stream("POST", "/responses", json={**structured(PLAIN_ID, schema, 3), "stream": True}) as r:
        raw = r.read()
    assert "\u2028".encode() not in raw and "\u0085".encode() not in raw  # sent as \u escapes
    final = check_stream(stream(client, structured(PLAIN_ID, schema, 3)))
    assert answer_json(final) == {"v": value}


def test_text_format_spelling_and_json_object(client: httpx.Client) -> None:
    schema = SCHEMAS["enum-const"]
    body = {
        "model": LLAMA_ID,
        "input": "x",
        "temperature": 1.0,
        "max_output_tokens": 200,
        "extensions": seeded(1),
        "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}},
    }
    doc = client.post("/responses", json=body).json()
    jsonschema.validate(answer_json(doc), schema)
    body = {
        "model": LLAMA_ID,
        "input": "x",
        "temperature": 1.0,
        "max_output_tokens": 300,
        "extensions": seeded(2),
        "response_format": {"type": "json_object"},
    }
    doc = client.post("/responses", json=body).json()
    if doc["status"] == "completed":
        assert isinstance(answer_json(doc), dict)


UNENFORCEABLE = [
    (
        {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^(?=9)[0-9]{5}$"}}},
        "response_format.json_schema.schema.properties.zip.pattern",
    ),
    (
        {"type": "string", "pattern": "^[0-9]+$", "maxLength": 5},
        "response_format.json_schema.schema.maxLength",
    ),
    (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "response_format.json_schema.schema.uniqueItems",
    ),
    ({"type": "integer", "multipleOf": 5}, "response_format.json_schema.schema.multipleOf"),
    ({"not": {"type": "string"}}, "response_format.json_schema.schema.not"),
    (
        {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        "response_format.json_schema.schema.if",
    ),
    ({"type": "string", "format": "ipv6"}, "response_format.json_schema.schema.format"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "response_format.json_schema.schema.patternProperties"),
    ({"type": "array", "contains": {"type": "integer"}}, "response_format.json_schema.schema.contains"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "response_format.json_schema.schema.oneOf"),
    ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "response_format.json_schema.schema.allOf"),
    ({"$ref": "https://example.com/schema.json"}, "response_format.json_schema.schema.$ref"),
    ({"type": "number", "minimum": 0.2, "maximum": 0.8}, "response_format.json_schema.schema.minimum"),
    (
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 2, "format": "date"}}},
        "response_format.json_schema.schema.properties.a.minLength",
    ),
    ({"type": "object", "minProperties": 2}, None),  # a free-form map: the count is enforced
    (
        {"type": "object", "properties": {"a": {}}, "minProperties": 1},
        "response_format.json_schema.schema.minProperties",
    ),
    ({"type": "string", "frobnicate": True}, "response_format.json_schema.schema.frobnicate"),
    (
        {"type": "object", "properties": {"a": {"type": "strnig"}}},
        "response_format.json_schema.schema.properties.a.type",
    ),
]


@pytest.mark.parametrize("schema, param", UNENFORCEABLE)
def test_unenforceable_schema_features_are_refused(
    client: httpx.Client, schema: dict[str, Any], param: str | None
) -> None:
    r = client.post("/responses", json=structured(PLAIN_ID, schema, 0, max_output_tokens=60))
    if param is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    doc = r.json()
    assert doc["code"] == "invalid_request" and doc["param"] == param, doc
    keyword = param.rsplit(".", 1)[-1]
    assert keyword in doc["detail"]


def test_text_format_errors_name_text_format(client: httpx.Client) -> None:
    body = {
        "model": PLAIN_ID,
        "input": "x",
        "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "integer", "multipleOf": 2}}},
    }
    r = client.post("/responses", json=body)
    assert r.status_code == 400 and r.json()["param"] == "text.format.schema.multipleOf"


@pytest.mark.parametrize("model", [QWEN_ID, R1_ID])
def test_reasoning_then_schema_valid_answer(client: httpx.Client, model: str) -> None:
    """Thinking comes first as a reasoning item, then the constrained JSON answer."""
    schema = SCHEMAS["object-required"]
    thought = 0
    for seed in range(6):
        doc = client.post("/responses", json=structured(model, schema, seed, max_output_tokens=600)).json()
        assert doc["status"] == "completed", doc
        kinds = [i["type"] for i in doc["output"]]
        assert kinds in (["message"], ["reasoning", "message"]), kinds
        if kinds[0] == "reasoning":
            thought += 1
            assert doc["output"][0]["id"].startswith("rs_")
            [part] = doc["output"][0]["summary"]
            assert part["type"] == "summary_text" and part["text"]
            assert "</think>" not in part["text"]
        jsonschema.validate(answer_json(doc), schema, format_checker=FORMAT_CHECKER)
    assert thought >= (3 if model == R1_ID else 1)  # R1's prompt opens the thought (an empty one leaves no item)


def test_reasoning_streams_summary_deltas(client: httpx.Client) -> None:
    evs = stream(client, structured(R1_ID, SCHEMAS["enum-const"], 3, max_output_tokens=600))
    final = check_stream(evs)
    names = [e.event for e in evs]
    first_reasoning = names.index("response.reasoning_summary_text.delta")
    first_text = names.index("response.output_text.delta")
    assert first_reasoning < first_text
    assert evs[names.index("response.output_item.added")].data["item"]["type"] == "reasoning"
    jsonschema.validate(answer_json(final), SCHEMAS["enum-const"])


@pytest.mark.parametrize("model", [QWEN_ID, R1_ID])
def test_reasoning_can_be_turned_off(client: httpx.Client, model: str) -> None:
    schema = SCHEMAS["refs-defs"]
    for seed in range(4):
        body = structured(model, schema, seed, extensions={"lmsp_tray": {"seed": seed, "reasoning": False}})
        doc = client.post("/responses", json=body).json()
        assert doc["status"] == "completed"
        assert [i["type"] for i in doc["output"]] == ["message"]
        jsonschema.validate(answer_json(doc), schema)


def test_free_text_thinking_becomes_a_reasoning_item(client: httpx.Client) -> None:
    thought = 0
    for seed in range(6):
        body = {
            "model": R1_ID,
            "input": "Why is the sky blue?",
            "temperature": 1.0,
            "max_output_tokens": 120,
            "extensions": seeded(seed),
        }
        items = client.post("/responses", json=body).json()["output"]
        if items[0]["type"] == "reasoning":  # the R1 prompt ends inside <think>
            thought += 1
            assert items[0]["summary"][0]["text"] and "</think>" not in items[0]["summary"][0]["text"]
    assert thought >= 3
