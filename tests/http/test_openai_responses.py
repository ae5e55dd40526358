"""`/v1/responses` with the official openai SDK over real HTTP and llama.cpp: OpenAI's defaults and shapes.

Store on by default, stored responses and their input items, namespace / custom / hosted tools,
`allowed_tools`, OpenAI's error object, and a stream that is silent between events (keep-alive
comments) read whole by the SDK.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from support import SLOW_ID, STREAM_PROMPTS, TINY_ID, LiveDaemon

from lmsp_tray.http import routes

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start a sub-agent",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string", "enum": ["go", "stop"]}},
                "required": ["message"],
            },
        },
        {
            "type": "function",
            "name": "wait_agent",
            "description": "Wait for a sub-agent",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "integer", "enum": [1, 2]}},
                "required": ["id"],
            },
        },
    ],
}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch", "format": {"type": "text"}}
HOSTED = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "code_interpreter"}]


@pytest.fixture
def sdk(daemon: LiveDaemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=daemon.base + "/v1", api_key=daemon.owner_token, max_retries=0) as client:
        yield client


def test_sync_and_stream_store_by_default(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(model=TINY_ID, input="Say hi", max_output_tokens=6, temperature=0)
    assert resp.id.startswith("resp_") and resp.status == "incomplete" and resp.output_text
    assert resp.store is True and resp.tools == [] and resp.usage is not None
    assert resp.usage.output_tokens == 6 and resp.usage.output_tokens_details.reasoning_tokens == 0
    # store defaulted to true: it can be read back and continued without sending `store`
    again = sdk.responses.retrieve(resp.id)
    assert again.id == resp.id and again.output_text == resp.output_text
    follow = sdk.responses.create(
        model=TINY_ID, input="And again", previous_response_id=resp.id, max_output_tokens=3, temperature=0
    )
    assert follow.previous_response_id == resp.id and follow.usage is not None
    assert follow.usage.input_tokens > resp.usage.input_tokens

    kinds, numbers, text = [], [], ""
    stream = sdk.responses.create(model=TINY_ID, input="Say hi", max_output_tokens=6, temperature=0, stream=True)
    for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text += event.delta
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert numbers == list(range(len(numbers)))
    assert text == resp.output_text


def test_input_items_and_delete(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(
        model=TINY_ID,
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]},
        ],
        max_output_tokens=2,
    )
    items = sdk.responses.input_items.list(resp.id)
    texts = [item.content[0].text for item in items.data]  # newest first, as OpenAI's default order
    assert texts == ["second", "ok", "first"]
    assert all(item.id and item.type == "message" for item in items.data)
    oldest = sdk.responses.input_items.list(resp.id, order="asc", limit=2)
    assert [i.content[0].text for i in oldest.data] == ["first", "ok"] and oldest.has_more
    rest = sdk.responses.input_items.list(resp.id, order="asc", after=oldest.last_id)
    assert [i.content[0].text for i in rest.data] == ["second"] and not rest.has_more
    deleted = sdk.responses.with_raw_response.delete(resp.id).http_response.json()
    assert deleted == {"id": resp.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.retrieve(resp.id)
    assert missing.value.body["code"] == "response_not_found"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list(resp.id)


def test_store_false_is_not_kept(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(model=TINY_ID, input="hi", max_output_tokens=2, store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(resp.id)


def test_namespace_tools_calls_split_back_and_hosted_tools_left_out(sdk: openai.OpenAI) -> None:
    tools: list[Any] = [WEATHER, NAMESPACE, *HOSTED]
    resp = sdk.responses.create(
        model=SLOW_ID,
        input="Start an agent",
        tools=tools,
        tool_choice={
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "namespace", "name": "multi_agent_v1"}],
        },
        temperature=0.7,
        max_output_tokens=120,
    )
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls, resp.output
    for call in calls:
        raw = call.model_dump()
        assert raw["namespace"] == "multi_agent_v1" and raw["name"] in ("spawn_agent", "wait_agent")
        json.loads(call.arguments)
    left_out = resp.model_dump()["extensions"]["lmsp_tray"]["tools_left_out"]
    assert [t["type"] for t in left_out] == ["web_search", "file_search", "code_interpreter"]
    assert [t["index"] for t in left_out] == [2, 3, 4]
    assert len(resp.tools) == 5  # echoed as sent

    # The call goes back as Codex sends it (name + namespace) with its output: the model sees its own call.
    call = calls[0].model_dump()
    follow = sdk.responses.create(
        model=SLOW_ID,
        input=[
            {"role": "user", "content": "Start an agent"},
            {k: call[k] for k in ("type", "call_id", "name", "namespace", "arguments")},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "agent 7 started"},
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "x"},
            },
        ],
        tools=tools,
        max_output_tokens=4,
    )
    assert follow.status in ("completed", "incomplete")
    # the stored turn's input items show the call as it was sent
    items = sdk.responses.input_items.list(follow.id, order="asc").model_dump()["data"]
    assert items[1]["type"] == "function_call" and items[1]["namespace"] == "multi_agent_v1"


def test_allowed_tools_offers_only_those(sdk: openai.OpenAI) -> None:
    other = {**WEATHER, "name": "get_time", "description": "Time in a city"}
    for seed in range(4):
        resp = sdk.responses.create(
            model=SLOW_ID,
            input="Weather?",
            tools=[WEATHER, other],
            tool_choice={
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_time"}],
            },
            temperature=1.0,
            max_output_tokens=120,
            extra_body={"extensions": {"lmsp_tray": {"seed": seed}}},
        )
        names = {item.name for item in resp.output if item.type == "function_call"}
        assert names == {"get_time"}, resp.output
    # mode auto over hosted tools only: nothing to call, a plain answer
    resp = sdk.responses.create(
        model=SLOW_ID,
        input="hi",
        tools=HOSTED,  # type: ignore[arg-type]
        tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}]},
        max_output_tokens=3,
    )
    assert all(item.type == "message" for item in resp.output)


def test_custom_tool_round_trip_sync_and_stream(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(
        model=SLOW_ID,
        input="Patch it",
        tools=[APPLY_PATCH, WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=400,
    )
    calls = [item for item in resp.output if item.type == "custom_tool_call"]
    assert calls and calls[0].name == "apply_patch" and isinstance(calls[0].input, str), resp.output
    call = calls[0]

    kinds, streamed, done = [], "", None
    stream = sdk.responses.create(
        model=SLOW_ID,
        input="Patch it",
        tools=[APPLY_PATCH],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=400,
        stream=True,
    )
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.custom_tool_call_input.delta":
            streamed += event.delta
        elif event.type == "response.output_item.done":
            done = event.item
    assert "response.function_call_arguments.delta" not in kinds
    assert "response.custom_tool_call_input.done" in kinds
    assert done is not None and done.type == "custom_tool_call" and done.input == streamed

    follow = sdk.responses.create(
        model=SLOW_ID,
        input=[
            {"role": "user", "content": "Patch it"},
            {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": call.input},
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"},
        ],
        tools=[APPLY_PATCH],  # type: ignore[list-item]
        max_output_tokens=3,
    )
    items = sdk.responses.input_items.list(follow.id, order="asc").model_dump()["data"]
    assert [i["type"] for i in items] == ["message", "custom_tool_call", "custom_tool_call_output"]
    assert items[1]["input"] == call.input


def test_errors_in_openai_shape(daemon: LiveDaemon, sdk: openai.OpenAI, closing: Callable) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.create(model="no-such-model", input="hi")
    assert missing.value.code == "model_not_found" and "no-such-model" in missing.value.message
    with pytest.raises(openai.BadRequestError) as forced:
        sdk.responses.create(model=TINY_ID, input="hi", tools=HOSTED, tool_choice={"type": "web_search_preview"})  # type: ignore[arg-type]
    assert forced.value.code == "unsupported_capability" and "web_search_preview" in forced.value.message
    with pytest.raises(openai.BadRequestError) as grammar:
        sdk.responses.create(
            model=TINY_ID,
            input="hi",
            tools=[
                {"type": "custom", "name": "sql", "format": {"type": "grammar", "syntax": "lark", "definition": "x"}}
            ],  # type: ignore[list-item]
        )
    assert grammar.value.code == "unsupported_capability" and grammar.value.param == "tools[0].format"
    with pytest.raises(openai.AuthenticationError):
        closing(openai.OpenAI(base_url=daemon.base + "/v1", api_key="nope", max_retries=0)).responses.create(
            model=TINY_ID, input="hi"
        )
    r = httpx.post(daemon.base + "/v1/responses", content=b"{", headers=daemon.auth_headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_idempotent_replay_in_openai_shape(daemon: LiveDaemon) -> None:
    headers = {**daemon.auth_headers, "Idempotency-Key": "k-1"}
    payload = {"model": TINY_ID, "input": "hi", "max_output_tokens": 3, "stream": True}
    with httpx.Client(base_url=daemon.base + "/v1", timeout=60, headers=headers) as c:
        first = c.post("/responses", json=payload)
        again = c.post("/responses", json=payload)
    assert again.headers["idempotent-replayed"] == "true"
    assert first.text == again.text
    assert "\nid:" not in "\n" + first.text  # OpenAI's events carry no SSE ids


def test_stream_with_keepalive_comments_between_events(
    daemon: LiveDaemon, sdk: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keep-alive comment after an event must not reach the SDK as an (empty, unparsable) event."""
    # A keep-alive after every millisecond of silence (`sse_keepalive`), and a silence that surely
    # lasts longer: evaluating a long prompt between response.created and the first delta.
    monkeypatch.setattr(routes, "keepalive", lambda _request: 0.001)  # answer_run asks it
    story = "Tell a story about the sea. " * 60  # about 1,600 tokens on this byte-level model
    raw = httpx.post(
        daemon.base + "/v1/responses",
        json={"model": SLOW_ID, "input": story, "max_output_tokens": 60, "stream": True},
        headers=daemon.auth_headers,
        timeout=120,
    ).text
    assert ": keep-alive" in raw  # the comments were there between events
    text = ""
    stream = sdk.responses.create(model=SLOW_ID, input=story, max_output_tokens=60, stream=True)
    for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
    assert text


def test_four_sdk_streams_decode_together(daemon_factory) -> None:
    """/v1 goes through the same scheduler: four concurrent streams share decode steps, each as it is alone.

    On the slower generated model: the tiny one decodes 40 tokens in about 50 ms, less than the
    four requests can take to arrive on a busy machine, so they would barely overlap."""
    live = daemon_factory(parallel=4)
    prompts = STREAM_PROMPTS
    client = openai.AsyncOpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0)

    async def one(prompt: str) -> str:
        stream = await client.responses.create(
            model=SLOW_ID, input=prompt, max_output_tokens=40, temperature=0, stream=True, store=False
        )
        return "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])

    async def scenario() -> tuple[list[str], list[str], int, int]:
        async with client:  # closed in this loop: an async client's sockets outlive it otherwise
            alone = [await one(p) for p in prompts]
            solo = live.scheduler(SLOW_ID).steps
            together = await asyncio.gather(*(one(p) for p in prompts))
        return alone, list(together), solo, live.scheduler(SLOW_ID).steps - solo

    alone, together, solo, steps = asyncio.run(scenario())
    assert together == alone
    assert steps < solo * 0.75  # far fewer decode steps than the four runs one after another took


def test_lmsp_v1_keeps_its_own_rules(daemon: LiveDaemon) -> None:
    """The same body on /lmsp/v1: LMSP's defaults and shapes (store off, function tools only, problem documents)."""
    with httpx.Client(base_url=daemon.url, timeout=60, headers=daemon.auth_headers) as c:
        plain = c.post("/responses", json={"model": TINY_ID, "input": "hi", "max_output_tokens": 2})
        assert plain.status_code == 200 and "tools" not in plain.json()
        assert c.get(f"/responses/{plain.json()['id']}").status_code == 404  # store defaults to false here
        namespaced = c.post("/responses", json={"model": TINY_ID, "input": "hi", "tools": [NAMESPACE]})
        assert namespaced.status_code == 400
        assert namespaced.headers["content-type"].startswith("application/problem+json")
        assert namespaced.json()["param"] == "tools[0].type"
