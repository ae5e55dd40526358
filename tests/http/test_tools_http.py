"""Function tools over HTTP with real llama.cpp on generated Qwen3- and Llama 3-style models."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from support import LiveDaemon
from tools_support import (  # noqa: F401  (pytest fixtures shared by the tool tests)
    BOOK,
    LLAMA_ID,
    PLAIN_ID,
    QWEN_ID,
    R1_ID,
    TOOLS,
    WEATHER,
    check_stream,
    client,
    live_config,
    live_files,
    output_of,
    request,
    seeded,
    stream,
    validate_call,
)

SEEDS = range(20)


def test_capabilities_per_model(client: httpx.Client) -> None:
    models = {m["id"]: m for m in client.get("/models").json()["data"]}
    assert {"tools", "structured_output", "reasoning"} <= set(models[QWEN_ID]["capabilities"])
    assert {"tools", "structured_output", "reasoning"} <= set(models[R1_ID]["capabilities"])
    for plain in (LLAMA_ID, PLAIN_ID):
        caps = set(models[plain]["capabilities"])
        assert {"text", "streaming", "tools", "structured_output"} <= caps and "reasoning" not in caps
    service = client.get("").json()
    assert {"tools", "structured_output"} <= set(service["capabilities"])


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID, PLAIN_ID])
def test_required_tool_choice_always_yields_valid_calls(client: httpx.Client, model: str) -> None:
    names = []
    for seed in SEEDS:
        r = client.post(
            "/responses",
            json=request(model, tools=TOOLS, tool_choice="required", temperature=1.0, extensions=seeded(seed)),
        )
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["status"] == "completed", doc
        calls = list(output_of("function_call", doc))
        assert calls, doc["output"]
        for call in calls:
            validate_call(call)
            assert call["status"] == "completed"
            names.append(call["name"])
        assert len({c["call_id"] for c in calls}) == len(calls)
    assert set(names) <= {"get_weather", "book_table"}


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID])
def test_named_tool_choice_calls_exactly_that_function(client: httpx.Client, model: str) -> None:
    for seed in SEEDS:
        body = request(
            model,
            "Book for two at eight.",
            tools=TOOLS,
            temperature=1.0,
            extensions=seeded(seed),
            tool_choice={"type": "function", "name": "book_table"},
        )
        doc = client.post("/responses", json=body).json()
        assert doc["status"] == "completed", doc
        [call] = list(output_of("function_call", doc))
        assert call["name"] == "book_table"
        validate_call(call)
        assert not list(output_of("message", doc))


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID])
def test_streamed_argument_deltas_add_up(client: httpx.Client, model: str) -> None:
    seen_deltas = 0
    for seed in range(6):
        body = request(model, tools=TOOLS, tool_choice="required", temperature=1.0, extensions=seeded(seed))
        evs = stream(client, body)
        final = check_stream(evs)
        assert final["status"] == "completed"
        calls = list(output_of("function_call", final))
        assert calls
        for call in calls:
            validate_call(call)
        names = [e.event for e in evs]
        for call in calls:
            added = next(
                i
                for i, e in enumerate(evs)
                if e.event == "response.output_item.added" and e.data["item"]["id"] == call["id"]
            )
            assert evs[added].data["item"]["name"] == call["name"]
            assert evs[added].data["item"]["arguments"] == ""
            deltas = [
                e
                for e in evs
                if e.event == "response.function_call_arguments.delta" and e.data["item_id"] == call["id"]
            ]
            seen_deltas += len(deltas)
        assert "response.function_call_arguments.done" in names
    assert seen_deltas > 12  # arguments arrive in pieces while they are generated


def test_sync_and_stream_agree(client: httpx.Client) -> None:
    body = request(QWEN_ID, tools=TOOLS, tool_choice="required", temperature=1.0, extensions=seeded(7))
    sync = client.post("/responses", json=body).json()
    final = check_stream(stream(client, body))
    strip = [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in sync["output"]]
    assert strip == [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in final["output"]]


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID])
def test_auto_calls_are_constrained_once_opened(client: httpx.Client, model: str) -> None:
    """These models like to open a call on their own; what follows the marker must be a valid call."""
    calls = 0
    for seed in range(16):
        body = request(
            model, tools=TOOLS, tool_choice="auto", temperature=1.0, extensions=seeded(seed), max_output_tokens=200
        )
        doc = client.post("/responses", json=body).json()
        assert doc["status"] in ("completed", "incomplete")
        for call in output_of("function_call", doc):
            if call["status"] == "completed":
                validate_call(call)
                calls += 1
    assert calls >= 2


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID])
def test_tool_choice_none_never_calls(client: httpx.Client, model: str) -> None:
    for seed in range(8):
        body = request(
            model, tools=TOOLS, tool_choice="none", temperature=1.0, extensions=seeded(seed), max_output_tokens=120
        )
        doc = client.post("/responses", json=body).json()
        assert doc["status"] in ("completed", "incomplete")
        assert not list(output_of("function_call", doc))


@pytest.mark.parametrize("model", [QWEN_ID, LLAMA_ID, PLAIN_ID])
def test_client_side_tool_loop(client: httpx.Client, model: str) -> None:
    history: list[dict] = [{"type": "message", "role": "user", "content": "Weather in Paris, in celsius?"}]
    first = client.post(
        "/responses",
        json={
            "model": model,
            "input": history,
            "tools": [WEATHER],
            "tool_choice": "required",
            "temperature": 0.8,
            "extensions": seeded(1),
            "max_output_tokens": 200,
        },
    ).json()
    assert first["status"] == "completed"
    [call] = list(output_of("function_call", first))
    args = validate_call(call, [WEATHER])
    # The client runs the tool and sends back the call as received plus its output.
    history += [item for item in first["output"] if item["type"] in ("reasoning", "function_call")]
    result = {"city": args["city"], "temperature": 17, "unit": args["unit"]}
    history.append({"type": "function_call_output", "call_id": call["call_id"], "output": json.dumps(result)})
    final = client.post(
        "/responses",
        json={
            "model": model,
            "input": history,
            "tools": [WEATHER],
            "tool_choice": "none",
            "temperature": 0.8,
            "max_output_tokens": 24,
            "extensions": seeded(2),
        },
    )
    assert final.status_code == 200, final.text
    doc = final.json()
    bare = client.post(
        "/responses",
        json={"model": model, "input": history[:1], "tools": [WEATHER], "tool_choice": "none", "max_output_tokens": 1},
    ).json()
    grown = doc["usage"]["input_tokens"] - bare["usage"]["input_tokens"]
    assert grown > len(call["arguments"]) + len(json.dumps(result))  # the call and its result reached the prompt
    [message] = list(output_of("message", doc))
    assert message["content"][0]["text"]
    # And a second round with the tool still offered works too.
    again = client.post(
        "/responses",
        json={
            "model": model,
            "input": history,
            "tools": [WEATHER],
            "tool_choice": "required",
            "extensions": seeded(3),
            "max_output_tokens": 200,
        },
    )
    assert again.status_code == 200
    for c in output_of("function_call", again.json()):
        validate_call(c, [WEATHER])


def test_unmatched_call_id_is_rejected(client: httpx.Client) -> None:
    body = {
        "model": QWEN_ID,
        "tools": [WEATHER],
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "ok"},
            {"type": "function_call_output", "call_id": "call_zzz", "output": "{}"},
        ],
    }
    r = client.post("/responses", json=body)
    assert r.status_code == 400
    doc = r.json()
    assert doc["code"] == "invalid_request" and doc["param"] == "input[3].call_id"
    assert "call_zzz" in doc["detail"]


BAD_TOOLS = [
    ([WEATHER, {**BOOK, "parameters": {"type": "string"}}], "auto", "tools[1].parameters"),
    ([WEATHER, {**BOOK, "parameters": []}], "auto", "tools[1].parameters"),
    ([WEATHER, {**BOOK, "name": "get_weather"}], "auto", "tools[1].name"),
    ([{**WEATHER, "name": "get weather!"}], "auto", "tools[0].name"),
    ([{**WEATHER, "name": "x" * 65}], "auto", "tools[0].name"),
    (
        [
            {
                **WEATHER,
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "pattern": "^(?!X)[A-Z]+$"}},
                },
            }
        ],
        "auto",
        "tools[0].parameters.properties.code.pattern",
    ),
    (
        [{**WEATHER, "parameters": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}],
        "auto",
        "tools[0].parameters.properties.n.multipleOf",
    ),
    ([WEATHER], {"type": "function", "name": "nope"}, "tool_choice.name"),
    ([], "required", "tool_choice"),
    ([{"type": "web_search"}], "auto", "tools[0].type"),
]


@pytest.mark.parametrize("tools, choice, param", BAD_TOOLS)
def test_invalid_tool_definitions(client: httpx.Client, tools: list, choice: object, param: str) -> None:
    r = client.post("/responses", json={"model": QWEN_ID, "input": "hi", "tools": tools, "tool_choice": choice})
    assert r.status_code == 400, r.text
    doc = r.json()
    assert doc["code"] == "invalid_request" and doc["param"] == param, doc
    assert "Traceback" not in r.text


def test_reasoning_capability_is_checked(client: httpx.Client) -> None:
    r = client.post(
        "/responses", json={"model": LLAMA_ID, "input": "hi", "extensions": {"lmsp_tray": {"reasoning": True}}}
    )
    assert r.status_code == 400
    assert r.json()["code"] == "unsupported_capability"
    assert r.json()["param"] == "extensions.lmsp_tray.reasoning"


def test_openai_sdk_runs_a_tool_loop(live: LiveDaemon, closing: Callable) -> None:
    """The official Responses client, unmodified: typed function_call items, streamed calls, results back."""
    import openai

    client = closing(openai.OpenAI(base_url=live.url, api_key=live.owner_token, max_retries=0))
    tools = [{**WEATHER, "strict": True}]
    first = client.responses.create(
        model=QWEN_ID,
        input="Weather in Oslo?",
        tools=tools,
        tool_choice="required",
        temperature=1.0,
        max_output_tokens=300,
        extra_body={"extensions": seeded(4)},
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and calls
    validate_call(calls[0].model_dump(), [WEATHER])
    with client.responses.stream(
        model=QWEN_ID,
        input="Weather in Oslo?",
        tools=tools,
        tool_choice="required",
        temperature=1.0,
        max_output_tokens=300,
        extra_body={"extensions": seeded(4)},
    ) as s:
        kinds = [event.type for event in s]
        streamed = s.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert [i.arguments for i in streamed.output if i.type == "function_call"] == [c.arguments for c in calls]
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
    ]
    history += [{"type": "function_call_output", "call_id": c.call_id, "output": '{"temperature": 4}'} for c in calls]
    final = client.responses.create(
        model=QWEN_ID,
        input=history,
        tools=tools,
        max_output_tokens=40,
        temperature=1.0,
        extra_body={"extensions": seeded(5)},
    )
    assert final.status in ("completed", "incomplete")
