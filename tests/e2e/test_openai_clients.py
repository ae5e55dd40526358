"""The Python client matrix against `/v1/responses`: openai-agents, LangChain, pydantic-ai and LiteLLM, unmodified.

Each is pointed at `base_url=…/v1` with a bearer token as its API key, over real HTTP to llama.cpp
on the generated models; each case exercises what that client does on its own (streams, tool
round-trips, `previous_response_id` without `store`, `allowed_tools`). Nothing reaches the
internet: tracing and cost-map downloads are switched off before the libraries are used.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Iterator
from typing import Literal

import openai
import pytest
from pydantic import BaseModel
from support import SLOW_ID, TINY_ID, LiveDaemon

from lmsp_tray.http import sse

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm would fetch its price list at import
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

# The clients run unmodified, so what they do wrong is theirs and let go here only: LangChain,
# pydantic-ai and LiteLLM keep HTTP clients they never close (unclosed sockets and transports, found
# by the collector, which each test's end runs so they are reported under these filters), and
# LiteLLM's logging serialises partial objects (pydantic "serializer warnings").
pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning"),
]


@pytest.fixture(autouse=True)
def collect_what_the_clients_leave() -> Iterator[None]:
    yield
    gc.collect()


City = Literal["Paris", "Oslo"]  # tools take an enum: a random model's calls stay short and complete


class Verdict(BaseModel):
    """A structured answer: its grammar ends the random model's output (status completed, not incomplete)."""

    ok: bool


@pytest.fixture
def v1(daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    # Keep-alive comments after 0.5 ms of silence instead of 15 s: every stream of the matrix has them
    # between its events, as a stream silent for 15 s (a long prompt, a queue wait) has.
    defaults = sse.EventStream.__init__.__kwdefaults__ or {}
    monkeypatch.setattr(sse.EventStream.__init__, "__kwdefaults__", {**defaults, "keepalive": 0.0005})
    yield daemon.base + "/v1", daemon.owner_token


# -- openai-agents -----------------------------------------------------------------------------


def _agents_model(v1: tuple[str, str], model: str = TINY_ID):
    from agents import OpenAIResponsesModel, set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=v1[0], api_key=v1[1], max_retries=0)
    return OpenAIResponsesModel(model=model, openai_client=client), client


def _run_closing(client: openai.AsyncOpenAI, work):
    """Run `work` and close the async client in the same loop (its sockets would leak to the next test)."""

    async def run():
        try:
            return await work
        finally:
            await client.close()

    return asyncio.run(run())


def test_agents_run_stream_and_continue(v1: tuple[str, str]) -> None:
    from agents import Agent, ModelSettings, Runner

    model, client = _agents_model(v1)
    # openai-agents treats `incomplete` (max_output_tokens) as a failure: a structured answer completes.
    agent = Agent(
        name="a",
        instructions="Be brief.",
        model=model,
        output_type=Verdict,
        model_settings=ModelSettings(max_tokens=40),
    )

    async def scenario() -> None:
        first = await Runner.run(agent, "Is it ok?")
        assert isinstance(first.final_output, Verdict)
        assert first.last_response_id and first.last_response_id.startswith("resp_")
        # previous_response_id without store: stored by default on /v1 (404 before)
        second = await Runner.run(agent, "Again?", previous_response_id=first.last_response_id)
        assert isinstance(second.final_output, Verdict)
        streamed = Runner.run_streamed(agent, "Is it ok?")
        kinds = [event.type async for event in streamed.stream_events()]
        assert "raw_response_event" in kinds and isinstance(streamed.final_output, Verdict)

    _run_closing(client, scenario())


def test_agents_function_tool_round_trip(v1: tuple[str, str]) -> None:
    from agents import Agent, ModelSettings, Runner, function_tool

    calls: list[str] = []

    @function_tool
    def get_weather(city: City) -> str:
        """Weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    model, client = _agents_model(v1, SLOW_ID)
    agent = Agent(
        name="w",
        model=model,
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="required", max_tokens=200),
        tool_use_behavior="stop_on_first_tool",
    )
    result = _run_closing(client, Runner.run(agent, "Weather in Paris?"))
    assert calls and result.final_output == f"sunny in {calls[0]}"


# -- LangChain ---------------------------------------------------------------------------------


def test_langchain_invoke_stream_tools_and_previous_response_id(v1: tuple[str, str], closing: Callable) -> None:
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=TINY_ID,
        base_url=v1[0],
        api_key=v1[1],  # type: ignore[arg-type]
        use_responses_api=True,
        use_previous_response_id=True,
        max_tokens=5,
        max_retries=0,
    )
    first = llm.invoke([HumanMessage("Say hi")])
    assert first.text and first.response_metadata["id"].startswith("resp_")
    # use_previous_response_id: only the new message goes out, with the last response's id
    second = llm.invoke([HumanMessage("Say hi"), first, HumanMessage("Again")])
    assert second.text
    sdk = closing(openai.OpenAI(base_url=v1[0], api_key=v1[1], max_retries=0))
    stored = sdk.responses.retrieve(second.response_metadata["id"])
    assert stored.previous_response_id == first.response_metadata["id"]  # 404 before: store was off
    sent = sdk.responses.input_items.list(stored.id).data
    assert [item.content[0].text for item in sent] == ["Again"]  # type: ignore[union-attr]
    chunks = list(llm.stream("Say hi"))
    assert "".join(c.text for c in chunks)

    @tool
    def get_weather(city: City) -> str:
        """Weather in a city."""
        return f"sunny in {city}"

    tooled = ChatOpenAI(
        model=SLOW_ID,
        base_url=v1[0],
        api_key=v1[1],
        use_responses_api=True,
        max_tokens=200,
        max_retries=0,  # type: ignore[arg-type]
    ).bind_tools([get_weather], tool_choice="get_weather")
    message = tooled.invoke("Weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert message.tool_calls[0]["args"]["city"] in ("Paris", "Oslo")


# -- pydantic-ai -------------------------------------------------------------------------------


def _pydantic_model(v1: tuple[str, str], model: str):
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIResponsesModel(model, provider=OpenAIProvider(base_url=v1[0], api_key=v1[1]))


def test_pydantic_ai_text_and_stream(v1: tuple[str, str]) -> None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(v1, TINY_ID), model_settings={"max_tokens": 5})
    result = agent.run_sync("Say hi")
    assert isinstance(result.output, str) and result.output

    async def streamed() -> str:
        async with agent.run_stream("Say hi") as run:
            return "".join([piece async for piece in run.stream_text(delta=True)])

    assert asyncio.run(streamed())


def test_pydantic_ai_tool_or_output_uses_allowed_tools(v1: tuple[str, str], closing: Callable) -> None:
    from pydantic_ai import Agent, ToolOrOutput

    calls: list[str] = []
    agent = Agent(
        _pydantic_model(v1, SLOW_ID),
        model_settings={"max_tokens": 200, "tool_choice": ToolOrOutput(function_tools=["get_weather"])},
    )

    @agent.tool_plain
    def get_weather(city: City) -> str:
        """Weather in a city."""
        calls.append(city)
        return "sunny"

    @agent.tool_plain
    def get_time(city: City) -> str:
        """Time in a city."""
        raise AssertionError("get_time was not among the allowed tools")

    result = agent.run_sync("Weather in Paris?")  # 400 before: tool_choice allowed_tools
    assert isinstance(result.output, str)
    first_id = result.all_messages()[1].provider_response_id  # type: ignore[union-attr]
    stored = closing(openai.OpenAI(base_url=v1[0], api_key=v1[1], max_retries=0)).responses.retrieve(first_id)
    choice = stored.model_dump()["tool_choice"]
    assert choice["type"] == "allowed_tools" and [t["name"] for t in choice["tools"]] == ["get_weather"]


# -- LiteLLM -----------------------------------------------------------------------------------


def test_litellm_responses_sync_and_stream(v1: tuple[str, str]) -> None:
    import litellm

    common = {"model": f"openai/{TINY_ID}", "api_base": v1[0], "api_key": v1[1], "max_output_tokens": 5}
    resp = litellm.responses(input="Say hi", **common)
    assert resp.id and resp.output and 0 < resp.usage.output_tokens <= 16  # litellm raises the limit to 16
    deltas = [
        e.delta
        for e in litellm.responses(input="Say hi", stream=True, **common)
        if e.type == "response.output_text.delta"
    ]
    assert "".join(deltas)
