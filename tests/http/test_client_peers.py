"""Existing client libraries work unmodified against /lmsp/v1: the official openai SDK and plain SSE."""

from __future__ import annotations

import httpx
import openai
from httpx_sse import connect_sse
from support import TINY_ID


def test_openai_sdk_sync_and_stream(daemon, closing) -> None:
    client = closing(openai.OpenAI(base_url=daemon.url, api_key=daemon.owner_token, max_retries=0))
    resp = client.responses.create(model=TINY_ID, input="Say hi", max_output_tokens=6, temperature=0)
    assert resp.id.startswith("resp_")
    assert resp.status == "incomplete"
    assert resp.output_text
    assert resp.usage.output_tokens == 6

    kinds = []
    text = ""
    stream = client.responses.create(model=TINY_ID, input="Say hi", max_output_tokens=6, temperature=0, stream=True)
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert text == resp.output_text

    # The SDK's accumulating helper rebuilds the response from the events (it wants a completed
    # response: stop on a piece of the known output).
    stop = resp.output_text[2:4]
    with client.responses.stream(
        model=TINY_ID,
        input="Say hi",
        max_output_tokens=6,
        temperature=0,
        extra_body={"extensions": {"lmsp_tray": {"stop": [stop]}}},
    ) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.status == "completed"
    assert final.output_text == resp.output_text[: resp.output_text.index(stop)]


def test_openai_sdk_sees_problem_documents(daemon, closing) -> None:
    client = closing(openai.OpenAI(base_url=daemon.url, api_key=daemon.owner_token, max_retries=0))
    try:
        client.responses.create(model="no-such-model", input="hi")
    except openai.NotFoundError as exc:
        assert exc.status_code == 404
        assert exc.body["code"] == "model_not_found"
    else:
        raise AssertionError("expected a 404")


def test_httpx_sse_client(daemon) -> None:
    with (
        httpx.Client(timeout=30, headers=daemon.auth_headers) as c,
        connect_sse(
            c,
            "POST",
            f"{daemon.url}/responses",
            json={"model": TINY_ID, "input": "x", "stream": True, "max_output_tokens": 4},
        ) as source,
    ):
        evs = list(source.iter_sse())
    assert [int(e.id) for e in evs] == list(range(1, len(evs) + 1))
    assert evs[-1].event == "response.incomplete"
