"""The `/v1/responses` translation both ways, as plain logic (the HTTP tests run it against llama.cpp)."""

from __future__ import annotations

import json

import pytest

from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.events import Event, ResponseAssembler
from lmsp_tray.protocol.openai_requests import CUSTOM_PARAMETERS, parse_openai_response_create
from lmsp_tray.protocol.openai_shapes import OpenAIView, page
from lmsp_tray.protocol.requests import FunctionCall, FunctionCallOutput, Message

FN = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
NS = {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "spawn_agent"}]}
CUSTOM = {"type": "custom", "name": "apply_patch", "format": {"type": "text"}}


def parse(**body: object):
    return parse_openai_response_create({"model": "m", "input": "hi", **body})


def test_store_defaults_to_true_and_the_request_is_echoed() -> None:
    request, _ = parse()
    assert request.store is True and request.input_items  # kept for input_items
    assert request.response_fields["store"] is True and request.response_fields["tools"] == []
    request, _ = parse(store=False, metadata={"a": "b"})
    assert request.store is False and request.response_fields["metadata"] == {"a": "b"}
    assert request.raw == {"model": "m", "input": "hi", "store": False, "metadata": {"a": "b"}}  # as sent


def test_tools_namespace_custom_and_hosted() -> None:
    request, tools = parse(tools=[FN, {"type": "web_search"}, NS, CUSTOM, {"type": "mcp", "server_label": "x"}])
    assert [t.name for t in request.tools] == ["get_weather", "multi_agent_v1__spawn_agent", "apply_patch"]
    assert request.tools[2].parameters == CUSTOM_PARAMETERS
    assert tools.namespaced == {"multi_agent_v1__spawn_agent": ("multi_agent_v1", "spawn_agent")}
    assert tools.custom == {"apply_patch"}
    assert tools.left_out == ({"index": 1, "type": "web_search"}, {"index": 4, "type": "mcp", "name": "x"})
    assert request.response_fields["extensions"]["lmsp_tray"]["tools_left_out"][0]["type"] == "web_search"
    with pytest.raises(UnsupportedCapability):
        parse(tools=[{**CUSTOM, "format": {"type": "grammar", "syntax": "lark", "definition": "x"}}])


def test_tool_choice_forms() -> None:
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}
    request, _ = parse(tools=[FN, NS, CUSTOM], tool_choice=allowed)
    assert request.tool_choice == "required" and [t.name for t in request.tools] == ["get_weather"]
    request, _ = parse(
        tools=[FN, NS], tool_choice={**allowed, "tools": [{"type": "namespace", "name": "multi_agent_v1"}]}
    )
    assert [t.name for t in request.tools] == ["multi_agent_v1__spawn_agent"]
    request, _ = parse(tools=[FN], tool_choice={**allowed, "mode": "auto", "tools": [{"type": "web_search"}]})
    assert request.tool_choice == "none" and request.tools == []
    with pytest.raises(InvalidRequest):
        parse(tools=[FN], tool_choice={**allowed, "tools": [{"type": "web_search"}]})
    request, _ = parse(tools=[CUSTOM], tool_choice={"type": "custom", "name": "apply_patch"})
    assert request.tool_choice == {"type": "function", "name": "apply_patch"}
    with pytest.raises(UnsupportedCapability):
        parse(tools=[{"type": "web_search"}], tool_choice={"type": "web_search"})


def test_input_items_as_the_model_saw_them() -> None:
    request, _ = parse(
        tools=[NS, CUSTOM],
        input=[
            {"role": "user", "content": "go"},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "spawn_agent",
                "namespace": "multi_agent_v1",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
            {"type": "web_search_call", "id": "ws", "status": "completed", "action": {"type": "search"}},
            {"type": "reasoning", "summary": [], "encrypted_content": "xyz"},
        ],
    )
    assert request.items == [
        Message("user", "go"),
        FunctionCall("c1", "multi_agent_v1__spawn_agent", "{}"),
        FunctionCallOutput("c1", "ok"),
        FunctionCall("c2", "apply_patch", json.dumps({"input": "*** patch"})),
        FunctionCallOutput("c2", "done"),
    ]
    with pytest.raises(UnsupportedCapability):
        parse(input=[{"type": "item_reference", "id": "msg_1"}])


def _call_events(name: str, arguments: str) -> list[Event]:
    asm = ResponseAssembler("m", fields={"tools": [NS, CUSTOM]})
    events = asm.start() + asm.function_call_start(name)
    for piece in (arguments[:5], arguments[5:]):
        events += asm.function_call_arguments(piece)
    return events + asm.complete(3, 4)


def test_custom_call_events_carry_the_plain_text_input() -> None:
    view = OpenAIView.of_response({"tools": [NS, CUSTOM]})
    out = [
        e for event in _call_events("apply_patch", json.dumps({"input": "line 1\nline 2"})) for e in view.event(event)
    ]
    names = [e.name for e in out]
    assert "response.function_call_arguments.delta" not in names
    delta = next(e for e in out if e.name == "response.custom_tool_call_input.delta")
    done = next(e for e in out if e.name == "response.output_item.done")
    assert delta.data["delta"] == "line 1\nline 2" and done.data["item"]["type"] == "custom_tool_call"
    assert done.data["item"]["input"] == "line 1\nline 2"
    assert [e.data["sequence_number"] for e in out] == list(range(len(out)))
    final = out[-1].data["response"]
    assert final["output"][0]["type"] == "custom_tool_call" and final["usage"]["output_tokens_details"]


def test_namespaced_calls_split_and_errors_in_openai_shape() -> None:
    view = OpenAIView.of_response({"tools": [NS]})
    out = [e for event in _call_events("multi_agent_v1__spawn_agent", "{}") for e in view.event(event)]
    item = next(e for e in out if e.name == "response.output_item.done").data["item"]
    assert (item["name"], item["namespace"], item["type"]) == ("spawn_agent", "multi_agent_v1", "function_call")
    asm = ResponseAssembler("m")
    failed = view.event((asm.start() + asm.fail({"code": "model_crashed", "detail": "The model stopped."}))[-1])[0]
    assert "error" not in failed.data
    assert failed.data["response"]["error"] == {"code": "model_crashed", "message": "The model stopped."}
    error = OpenAIView.of_response({}).event(
        Event(9, "error", {"type": "error", "error": {"code": "internal_error", "detail": "x"}})
    )[0]
    assert error.data == {
        "type": "error",
        "sequence_number": 0,
        "code": "internal_error",
        "message": "x",
        "param": None,
    }


def test_input_items_page() -> None:
    view = OpenAIView.of_response({"tools": [CUSTOM]})
    items = view.input_items(
        [
            {"type": "message", "role": "user", "content": "a"},
            {"type": "function_call", "call_id": "c", "name": "apply_patch", "arguments": '{"input": "p"}'},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
        "resp_X",
    )
    assert [i["type"] for i in items] == ["message", "custom_tool_call", "custom_tool_call_output"]
    assert items[0]["content"] == [{"type": "input_text", "text": "a"}] and items[1]["input"] == "p"
    assert len({i["id"] for i in items}) == 3
    first = page(items, order="desc", after=None, limit=2)
    assert [i["type"] for i in first["data"]] == ["custom_tool_call_output", "custom_tool_call"] and first["has_more"]
    rest = page(items, order="desc", after=first["last_id"], limit=2)
    assert [i["type"] for i in rest["data"]] == ["message"] and not rest["has_more"]


def test_long_namespaced_names_stay_distinct_and_map_back() -> None:
    space = "mcp__a_very_long_server_name_for_the_documentation_search__"
    ns = {
        "type": "namespace",
        "name": space,
        "tools": [{"type": "function", "name": n} for n in ("search_all", "search_one")],
    }
    request, tools = parse(tools=[ns])
    names = [t.name for t in request.tools]
    assert len(set(names)) == 2 and all(len(n) <= 64 for n in names)
    assert {tools.namespaced[n] for n in names} == {(space, "search_all"), (space, "search_one")}
    again, _ = parse(
        tools=[ns],
        input=[{"type": "function_call", "call_id": "c", "name": "search_one", "namespace": space, "arguments": "{}"}],
    )
    assert again.items[0] == FunctionCall("c", tools_name(tools, space, "search_one"), "{}")


def tools_name(tools, space: str, name: str) -> str:
    return next(flat for flat, pair in tools.namespaced.items() if pair == (space, name))


def test_reasoning_effort_none_turns_thinking_off() -> None:
    assert parse(reasoning={"effort": "none"})[0].reasoning is False
    assert parse(reasoning={"effort": "high"})[0].reasoning is None
    on = parse(reasoning={"effort": "none"}, extensions={"lmsp_tray": {"reasoning": True}})[0]
    assert on.reasoning is True  # the service's own option wins
