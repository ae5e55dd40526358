"""A client-side tool loop through `previous_response_id`: the stored call is the context of its result."""

from __future__ import annotations

import json

import httpx
from support import LiveDaemon, wait_task
from tools_support import (  # noqa: F401  (pytest fixtures shared by the tool tests)
    QWEN_ID,
    WEATHER,
    live_config,
    live_files,
    output_of,
    seeded,
    validate_call,
)


def test_tool_result_continues_the_stored_call(live: LiveDaemon) -> None:
    with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c:
        first = c.post(
            "/responses",
            json={
                "model": QWEN_ID,
                "input": "Weather in Paris, in celsius?",
                "tools": [WEATHER],
                "tool_choice": "required",
                "temperature": 0.8,
                "extensions": seeded(1),
                "max_output_tokens": 200,
                "store": True,
            },
        ).json()
        assert first["status"] == "completed", first
        [call] = list(output_of("function_call", first))
        args = validate_call(call, [WEATHER])
        result = {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": json.dumps({"city": args["city"], "temperature": 17}),
        }
        # Only the tool's result is sent: the call itself comes from the stored response.
        turn = {
            "model": QWEN_ID,
            "input": [result],
            "previous_response_id": first["id"],
            "tools": [WEATHER],
            "tool_choice": "none",
            "temperature": 0.8,
            "extensions": seeded(2),
            "max_output_tokens": 24,
            "store": True,
        }
        second = c.post("/responses", json=turn)
        assert second.status_code == 200, second.text
        doc = second.json()
        assert list(output_of("message", doc))
        # It is the very prompt the client would get by sending the whole history itself.
        explicit = {
            **turn,
            "previous_response_id": None,
            "store": False,
            "max_output_tokens": 1,
            "input": [
                {"role": "user", "content": "Weather in Paris, in celsius?"},
                *[i for i in first["output"] if i["type"] in ("reasoning", "function_call")],
                result,
            ],
        }
        whole = c.post("/responses", json=explicit)
        assert whole.status_code == 200, whole.text
        assert whole.json()["usage"]["input_tokens"] == doc["usage"]["input_tokens"]
        # The same turn as a task.
        task = c.post("/tasks", json=turn)
        assert task.status_code == 202, task.text
        state = wait_task(c, task.json()["id"], {"completed", "incomplete", "failed", "cancelled"})
        assert state["status"] in ("completed", "incomplete"), state
        # A result for a call that is not in the chain is still refused.
        r = c.post("/responses", json={**turn, "input": [{**result, "call_id": "call_unknown"}]})
        assert r.status_code == 400 and "call_unknown" in r.json()["detail"]
