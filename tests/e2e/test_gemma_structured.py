"""Structured output and tool calls on the real Gemma 3 270M file (built-in template, no tools in it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from support import LiveDaemon, events, start_daemon

pytestmark = pytest.mark.gemma

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "country": {"type": "string", "minLength": 1, "maxLength": 40},
        "population": {"type": "integer", "minimum": 0},
        "capital": {"type": "boolean"},
        "founded": {"type": "string", "format": "date"},
        "districts": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 3},
    },
    "required": ["city", "country", "population", "capital", "districts"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory, gemma_gguf: Path) -> Iterator[tuple[LiveDaemon, str]]:
    folder = tmp_path_factory.mktemp("gemma")
    (folder / gemma_gguf.name).symlink_to(gemma_gguf)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(tmp_path_factory.mktemp("home")))
        live = start_daemon(folder, threads=1)
        try:
            with httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c:
                [model] = c.get("/models").json()["data"]
            assert {"tools", "structured_output"} <= set(model["capabilities"])
            assert "reasoning" not in model["capabilities"]
            yield live, model["id"]
        finally:
            live.stop()


def test_gemma_structured_output_is_schema_valid(gemma: tuple[LiveDaemon, str]) -> None:
    live, model = gemma
    body = {
        "model": model,
        "input": "Describe Paris as a JSON record.",
        "temperature": 0,
        "max_output_tokens": 160,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
    }
    with httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c:
        doc = c.post("/responses", json=body).json()
        assert doc["status"] == "completed", doc
        value = json.loads(doc["output"][0]["content"][0]["text"])
        jsonschema.validate(value, CITY, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        with c.stream(
            "POST",
            "/responses",
            json={**body, "stream": True, "temperature": 0.7, "extensions": {"lmsp_tray": {"seed": 3}}},
        ) as r:
            evs = events(r)
        text = "".join(e.data["delta"] for e in evs if e.event == "response.output_text.delta")
        assert evs[-1].event == "response.completed"
        jsonschema.validate(json.loads(text), CITY)


def test_gemma_required_tool_call_via_builtin_instruction(gemma: tuple[LiveDaemon, str]) -> None:
    live, model = gemma
    body = {
        "model": model,
        "input": "What is the weather in Paris right now?",
        "temperature": 0,
        "max_output_tokens": 80,
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    with httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c:
        doc = c.post("/responses", json=body).json()
    assert doc["status"] == "completed", doc
    [call] = [i for i in doc["output"] if i["type"] == "function_call"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])
