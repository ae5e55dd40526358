"""Generated family models for the tool / structured-output / reasoning tests, and helpers.

The models are the tiny random llama GGUFs of `gguf_factory` with a family's
chat template. Random weights wander: a string would run for hundreds of
tokens before a closing quote happens to win, so these models get a steady
preference (`logit_bias`) for `"` and for the thinking/call markers. That only
shortens what they write; whether it is *valid* is still up to the grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from chat_templates import DEEPSEEK_R1, LLAMA31, QWEN3
from gguf_factory import write_tiny_gguf
from support import SSE, LiveDaemon, events

QWEN_ID = "qwen3-tiny:1m-f32"
LLAMA_ID = "llama3-tiny:1m-f32"
R1_ID = "r1-tiny:1m-f32"
PLAIN_ID = "plain-tiny:1m-f32"

BIAS = {'"': 75.0}
SCALE = 0.5  # flatter than the default tiny model: seeds make a difference


def write_family_models(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_tiny_gguf(
        folder / "qwen3-tiny.gguf",
        chat_template=QWEN3,
        basename="qwen3-tiny",
        seed=3,
        context_length=4096,
        output_scale=SCALE,
        logit_bias={**BIAS, "<think>": 50.0, "</think>": 60.0, "<tool_call>": 80.0, "<|im_end|>": 66.0},
    )
    write_tiny_gguf(
        folder / "llama3-tiny.gguf",
        chat_template=LLAMA31,
        basename="llama3-tiny",
        seed=4,
        context_length=4096,
        output_scale=SCALE,
        logit_bias={**BIAS, "<|python_tag|>": 120.0, "<|eot_id|>": 66.0},
    )
    write_tiny_gguf(
        folder / "r1-tiny.gguf",
        chat_template=DEEPSEEK_R1,
        basename="r1-tiny",
        seed=5,
        context_length=4096,
        output_scale=SCALE,
        logit_bias={**BIAS, "</think>": 65.0},
    )
    write_tiny_gguf(
        folder / "plain-tiny.gguf",
        basename="plain-tiny",
        seed=6,
        context_length=4096,
        output_scale=SCALE,
        logit_bias=BIAS,
    )
    return folder


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 24},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
BOOK = {
    "type": "function",
    "name": "book_table",
    "description": "Book a table.",
    "parameters": {
        "type": "object",
        "properties": {
            "people": {"type": "integer", "minimum": 1, "maximum": 12},
            "time": {"type": "string", "format": "time"},
            "tags": {"type": "array", "items": {"enum": ["window", "quiet", "terrace"]}, "maxItems": 3},
            "vip": {"type": "boolean"},
        },
        "required": ["people", "time"],
    },
}
TOOLS = [WEATHER, BOOK]
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def live_files(family_models: list[Path]) -> list[Path]:
    """The tool tests' `live` daemon (conftest.py) serves the family models."""
    return family_models


@pytest.fixture(scope="module")
def live_config() -> dict[str, Any]:
    return {"parallel": 2, "threads": 1}  # 1 thread: steady on a busy machine


@pytest.fixture
def client(live: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c:
        yield c


def validate_call(item: dict[str, Any], tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    """Check a function_call item's shape and that its arguments validate; returns the arguments."""
    assert item["type"] == "function_call", item
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    by_name = {t["name"]: t for t in tools}
    assert item["name"] in by_name, item
    assert isinstance(item["arguments"], str)
    args = json.loads(item["arguments"])
    jsonschema.validate(args, by_name[item["name"]]["parameters"], format_checker=FORMAT_CHECKER)
    return args


def request(model: str, text: str = "What is the weather in Paris?", **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": [{"role": "user", "content": text}], "max_output_tokens": 300, **extra}


def seeded(seed: int, **lmsp: Any) -> dict[str, Any]:
    return {"lmsp_tray": {"seed": seed, **lmsp}}


def stream(client: httpx.Client, body: dict[str, Any]) -> list[SSE]:
    with client.stream("POST", "/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return events(r)


def check_stream(evs: list[SSE]) -> dict[str, Any]:
    """Stream invariants: ids 1..n, one terminal event last, deltas add up to each done item."""
    assert [e.id for e in evs] == list(range(1, len(evs) + 1))
    assert evs[0].event == "response.created"
    terminal = [
        e
        for e in evs
        if e.event in {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
    ]
    assert len(terminal) == 1 and terminal[0] is evs[-1]
    added: dict[str, int] = {}
    deltas: dict[str, list[str]] = {}
    done: dict[str, dict[str, Any]] = {}
    kinds = {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_text.delta",
    }
    for e in evs:
        if e.event == "response.output_item.added":
            added[e.data["item"]["id"]] = e.id
        elif e.event in kinds:
            item_id = e.data["item_id"]
            assert item_id in added and item_id not in done, "delta outside its item"
            deltas.setdefault(item_id, []).append(e.data["delta"])
        elif e.event == "response.output_item.done":
            done[e.data["item"]["id"]] = e.data["item"]
    assert set(added) == set(done)
    for item_id, item in done.items():
        got = "".join(deltas.get(item_id, []))
        if item["type"] == "function_call":
            assert got == item["arguments"]
        elif item["type"] == "message":
            assert got == item["content"][0]["text"]
        else:
            assert got == item["summary"][0]["text"]
    final = evs[-1].data["response"]
    assert [i["id"] for i in final["output"]] == list(done)
    return final


def output_of(kind: str, response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (item for item in response["output"] if item["type"] == kind)
