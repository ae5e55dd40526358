"""`POST /v1/messages` with the official anthropic SDK against real llama.cpp on generated models.

Sync and streamed messages (the SDK's stream helpers assemble the message), Anthropic's event
order, stop reasons (`max_tokens`, `stop_sequence`, `tool_use`), tools round trip with
`tool_result`, thinking on a reasoning-template model, count_tokens, the model list as Anthropic's
clients read it, errors in Anthropic's shape (NotFoundError, AuthenticationError, BadRequestError),
`x-api-key` and bearer keys, `[model_aliases]`, Claude Code's billing header kept cacheable, and
four streams decoding together.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from gguf_factory import write_tiny_gguf
from support import SLOW_ID, TINY_ID, LiveDaemon, assert_streams_decode_together, start_daemon
from tools_support import FORMAT_CHECKER, QWEN_ID, R1_ID, write_family_models

ALIAS = "claude-sonnet-4-5"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 24},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
HI = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDaemon]:
    home = tmp_path_factory.mktemp("home")
    models = write_family_models(tmp_path_factory.mktemp("family-models"))
    write_tiny_gguf(models / "tiny-test-1m-f32.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(home))
        daemon = start_daemon(models, parallel=2, threads=1, model_aliases={ALIAS: TINY_ID})
        try:
            yield daemon
        finally:
            daemon.stop()


@pytest.fixture(scope="module")
def sdk(live: LiveDaemon) -> Iterator[anthropic.Anthropic]:
    """The SDK as most apps configure it: the token as `api_key` (sent as `x-api-key`)."""
    with anthropic.Anthropic(base_url=live.base, api_key=live.owner_token, max_retries=0, timeout=120) as client:
        yield client


def raw_events(live: LiveDaemon, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The stream's (event, data) pairs as sent, read without the SDK."""
    out: list[tuple[str, dict[str, Any]]] = []
    headers = {"x-api-key": live.owner_token, "anthropic-version": "2023-06-01"}
    with httpx.stream(
        "POST", live.base + "/v1/messages", json={**body, "stream": True}, headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                out.append((name, data))
    return out


def test_sync_message(sdk: anthropic.Anthropic) -> None:
    done = sdk.messages.create(model=TINY_ID, max_tokens=6, messages=HI, extra_body={"temperature": 0})
    assert done.type == "message" and done.role == "assistant" and done.id.startswith("msg_")
    assert done.model == TINY_ID
    (block,) = done.content
    assert block.type == "text" and block.text
    assert done.stop_reason == "max_tokens" and done.stop_sequence is None
    assert done.usage.output_tokens == 6 and done.usage.input_tokens > 0
    # The same request again reads its prompt from the cache, and says so.
    again = sdk.messages.create(model=TINY_ID, max_tokens=6, messages=HI, extra_body={"temperature": 0})
    assert again.content == done.content
    assert again.usage.cache_read_input_tokens and again.usage.cache_read_input_tokens > 0
    total = done.usage.input_tokens + (done.usage.cache_read_input_tokens or 0)
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == total
    # A stop sequence ends the message, and the answer names it.
    stop = block.text[2:4]
    stopped = sdk.messages.create(
        model=TINY_ID, max_tokens=6, messages=HI, stop_sequences=[stop], extra_body={"temperature": 0}
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stop not in stopped.content[0].text  # type: ignore[union-attr]
    # max_tokens is a ceiling: one over the context window still answers, cut where the window ends.
    wide = sdk.messages.create(
        model=TINY_ID, max_tokens=100_000, messages=HI, extra_body={"temperature": 0, "top_k": 5, "top_p": 0.9}
    )
    assert wide.stop_reason in {"max_tokens", "end_turn"}
    # system as a string and as blocks, metadata ignored
    both = sdk.messages.create(
        model=TINY_ID,
        max_tokens=4,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Plain words."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}],
        metadata={"user_id": "someone"},
    )
    assert both.usage.output_tokens == 4


def test_stream_events_and_helpers(sdk: anthropic.Anthropic, live: LiveDaemon) -> None:
    body = {"model": TINY_ID, "max_tokens": 8, "messages": HI, "temperature": 0}
    events = raw_events(live, body)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["model"] == TINY_ID and start["content"] == [] and start["stop_reason"] is None
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8
    # The SDK's stream helpers assemble the same message.
    with sdk.messages.stream(
        **{k: v for k, v in body.items() if k != "temperature"}, extra_body={"temperature": 0}
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0


def test_tools_round_trip(sdk: anthropic.Anthropic) -> None:
    server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    done = sdk.messages.create(
        model=QWEN_ID,
        max_tokens=200,
        messages=asked,
        tools=[WEATHER, server_tool],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    assert done.stop_reason == "tool_use"
    calls = [b for b in done.content if b.type == "tool_use"]
    assert calls and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, WEATHER["input_schema"], format_checker=FORMAT_CHECKER)
    # Anthropic's own tools are not offered to the model, and the answer says so.
    assert done.model_dump()["extensions"]["lmsp_tray"]["tools_left_out"] == [
        {"index": 1, "type": "web_search_20250305", "name": "web_search"}
    ]
    # The result goes back as a tool_result block (string or blocks, is_error), and the model answers.
    turn = [
        *asked,
        {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in done.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": calls[0].id, "content": [{"type": "text", "text": "21 C"}]},
                {"type": "text", "text": "Thanks."},
            ],
        },
    ]
    answer = sdk.messages.create(
        model=QWEN_ID,
        max_tokens=30,
        messages=turn,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        extra_body={"temperature": 0},  # a random sample of this reasoning model may open a thinking block
    )
    assert answer.stop_reason in {"end_turn", "max_tokens"}
    assert [b.type for b in answer.content if b.type != "thinking"] == ["text"]  # no call: tool_choice none
    failed = [
        *turn[:2],
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "no network", "is_error": True}],
        },
    ]
    assert sdk.messages.create(model=QWEN_ID, max_tokens=5, messages=failed, tools=[WEATHER]).usage.output_tokens > 0


def test_streamed_named_tool_call(sdk: anthropic.Anthropic, live: LiveDaemon) -> None:
    body = {
        "model": QWEN_ID,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "temperature": 0,  # the same call twice: through the raw events, then the SDK
    }
    events = raw_events(live, body)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    call = next(b for b in starts if b["type"] == "tool_use")
    assert call["name"] == "get_weather" and call["input"] == {}
    partial = "".join(
        d["delta"]["partial_json"] for n, d in events if d.get("delta", {}).get("type") == "input_json_delta"
    )
    jsonschema.validate(json.loads(partial), WEATHER["input_schema"], format_checker=FORMAT_CHECKER)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    sampling = {k: v for k, v in body.items() if k != "temperature"}
    with sdk.messages.stream(**sampling, extra_body={"temperature": 0}) as stream:  # the SDK parses `input`
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (used,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(used.input, WEATHER["input_schema"], format_checker=FORMAT_CHECKER)


def test_thinking(sdk: anthropic.Anthropic) -> None:
    ask = {"model": R1_ID, "max_tokens": 200, "messages": [{"role": "user", "content": "Think first."}]}
    done = sdk.messages.create(
        **ask, thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 1, "top_k": 40}
    )
    kinds = [b.type for b in done.content]
    assert kinds[0] == "thinking", kinds
    thought = done.content[0]
    assert thought.thinking and thought.signature  # type: ignore[union-attr]
    with sdk.messages.stream(
        **ask, thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0}
    ) as stream:
        pieces = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert final.content[0].type == "thinking"
    assert "".join(pieces) == final.content[0].thinking and final.content[0].signature  # type: ignore[union-attr]
    # A thinking block sent back is accepted (and not shown to the model again); thinking can be turned off.
    back = [
        *ask["messages"],  # type: ignore[list-item]
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": "Again."},
    ]
    off = sdk.messages.create(
        model=R1_ID, max_tokens=20, messages=back, thinking={"type": "disabled"}, extra_body={"temperature": 0}
    )
    assert "thinking" not in [b.type for b in off.content]
    # A model without reasoning answers a request for thinking without it.
    plain = sdk.messages.create(
        model=TINY_ID, max_tokens=3, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert [b.type for b in plain.content] == ["text"]


def test_count_tokens(sdk: anthropic.Anthropic) -> None:
    counted = sdk.messages.count_tokens(model=TINY_ID, messages=HI, system="Be brief.")
    done = sdk.messages.create(model=TINY_ID, max_tokens=2, messages=HI, system="Be brief.")
    assert counted.input_tokens == done.usage.input_tokens + (done.usage.cache_read_input_tokens or 0) > 0
    with_tools = sdk.messages.count_tokens(model=QWEN_ID, messages=HI, tools=[WEATHER])  # type: ignore[list-item]
    without = sdk.messages.count_tokens(model=QWEN_ID, messages=HI)
    assert with_tools.input_tokens > without.input_tokens


def test_models_for_anthropic_clients(sdk: anthropic.Anthropic, live: LiveDaemon) -> None:
    ids = [m.id for m in sdk.models.list()]
    assert TINY_ID in ids and QWEN_ID in ids
    model = sdk.models.retrieve(TINY_ID)
    assert model.type == "model" and model.id == TINY_ID and model.display_name
    # Without anthropic-version the same path answers OpenAI's clients as before.
    r = httpx.get(live.base + "/v1/models", headers=live.auth_headers, timeout=30)
    assert r.json()["object"] == "list" and r.json()["data"][0]["object"] == "model"


def test_errors_in_anthropic_shape(sdk: anthropic.Anthropic, live: LiveDaemon, closing: Callable) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(model="no-such-model", max_tokens=5, messages=HI)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "no-such-model" in missing.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model=TINY_ID, max_tokens=5, messages=HI, extra_body={"temperature": 3})
    assert bad.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": bad.value.body["error"]["message"]},
    }  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(
            model=TINY_ID,
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                    ],
                }
            ],
        )
    headers = {"x-api-key": live.owner_token, "anthropic-version": "2023-06-01"}
    r = httpx.post(live.base + "/v1/messages", json={"model": TINY_ID, "messages": HI}, headers=headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == {
        "type": "invalid_request_error",
        "message": "'max_tokens' is required.",
    }
    r = httpx.post(live.base + "/v1/messages", content=b"{", headers=headers, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error" and "Traceback" not in r.text
    for nobody in (
        closing(anthropic.Anthropic(base_url=live.base, api_key="lmsp_wrong", max_retries=0)),
        closing(anthropic.Anthropic(base_url=live.base, auth_token="lmsp_wrong", max_retries=0)),
    ):
        with pytest.raises(anthropic.AuthenticationError) as refused:
            nobody.messages.create(model=TINY_ID, max_tokens=5, messages=HI)
        assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_bearer_key_and_aliases(live: LiveDaemon, closing: Callable) -> None:
    bearer = closing(anthropic.Anthropic(base_url=live.base, auth_token=live.owner_token, max_retries=0, timeout=120))
    done = bearer.messages.create(model=ALIAS, max_tokens=3, messages=HI, extra_body={"temperature": 0})
    assert done.model == ALIAS  # the name asked for, answered by the model it names
    direct = bearer.messages.create(model=TINY_ID, max_tokens=3, messages=HI, extra_body={"temperature": 0})
    assert done.content == direct.content
    with pytest.raises(anthropic.NotFoundError):  # a name that is neither an id nor an alias: never another model
        bearer.messages.create(model="claude-opus-4-1", max_tokens=3, messages=HI)
    # The same aliases apply on every API.
    r = httpx.post(
        live.base + "/v1/chat/completions",
        json={"model": ALIAS, "messages": HI, "max_tokens": 2},
        headers=live.auth_headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = httpx.get(live.base + f"/lmsp/v1/models/{ALIAS}", headers=live.auth_headers, timeout=60)
    assert r.status_code == 200 and r.json()["id"] == TINY_ID


def claude_code_system(stamp: str) -> list[dict[str, str]]:
    """System blocks as Claude Code sends them: the billing header with its per-request stamp first."""
    header = f"x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch={stamp};"
    rules = "You are a coding agent. Read the files, make the change, run the tests. " * 3
    return [{"type": "text", "text": header}, {"type": "text", "text": rules}]


def test_billing_header_keeps_the_prompt_cacheable(sdk: anthropic.Anthropic) -> None:
    first = sdk.messages.create(model=TINY_ID, max_tokens=2, system=claude_code_system("a5145"), messages=HI)  # type: ignore[arg-type]
    second = sdk.messages.create(model=TINY_ID, max_tokens=2, system=claude_code_system("9c3e0"), messages=HI)  # type: ignore[arg-type]
    prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    assert prompt > 200
    # The stamp sits ~70 tokens into the prompt: without normalising it, at most those would be reused.
    assert (second.usage.cache_read_input_tokens or 0) >= prompt - 8


def test_four_message_streams_decode_together(daemon_factory: Any) -> None:
    """Batching holds on /v1/messages: four concurrent streams equal their solo output and share decode steps."""
    live = daemon_factory(parallel=4)
    with anthropic.Anthropic(base_url=live.base, api_key=live.owner_token, max_retries=0, timeout=120) as sdk:

        def run(prompt: str) -> str:
            with sdk.messages.stream(
                model=SLOW_ID,
                max_tokens=40,
                messages=[{"role": "user", "content": prompt}],
                extra_body={"temperature": 0},
            ) as stream:
                return "".join(stream.text_stream)

        assert_streams_decode_together(live, run)
