"""Keep-alives are invisible to the official openai SDK, and problem documents carry `message`.

A stream that stays silent after its first event (here: queued behind a long generation on a
model that decodes one sequence at a time) gets keep-alive comments (`sse_keepalive`, shortened
for the test from 15 s). After an event with an `id:` line, a comment followed by a blank line made
the SDK dispatch an empty event and fail with JSONDecodeError; the SDK must read the stream whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import openai
from support import SLOW_ID, SSE, LiveDaemon, body, iter_sse

LONG = 200  # tokens the first request generates while the second waits (~0.2 s on a fast machine)


def hold_the_model(live: LiveDaemon) -> threading.Thread:
    """Stream a long generation on the slow model in a thread; returns it and an event set at its first delta."""
    started = threading.Event()

    def run() -> None:
        with (
            httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c,
            c.stream(
                "POST", "/responses", json=body("Tell a story", model=SLOW_ID, max_output_tokens=LONG, stream=True)
            ) as r,
        ):
            for line in r.iter_lines():
                if "output_text.delta" in line:
                    started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(120), "the long generation did not start"
    return thread


def test_sdk_reads_a_stream_silent_between_events(daemon_factory: Callable[..., LiveDaemon], closing: Callable) -> None:
    # Without drafts: the same long generation holds the model three times, and asked again it would
    # draft its earlier answer (speculation.Recent) and end before the keep-alives this test reads.
    live = daemon_factory(sse_keepalive=0.02, parallel=1, speculative=False)
    # The official SDK, on /lmsp/v1 (ids on every event) and on /v1 (chat chunks), reads it whole.
    sdk = closing(openai.OpenAI(base_url=live.url, api_key=live.owner_token, max_retries=0, timeout=300))
    thread = hold_the_model(live)
    kinds = [e.type for e in sdk.responses.create(model=SLOW_ID, input="hi", max_output_tokens=4, stream=True)]
    thread.join(300)
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    chat = closing(openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0, timeout=300))
    thread = hold_the_model(live)
    chunks = list(
        chat.chat.completions.create(
            model=SLOW_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
    )
    thread.join(300)
    assert chunks[-1].choices[0].finish_reason == "length"
    # On the wire: a keep-alive comment after an event with an id, and no blank line after it.
    thread = hold_the_model(live)
    with (
        httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c,
        c.stream("POST", "/responses", json=body("hi", model=SLOW_ID, max_output_tokens=4, stream=True)) as r,
    ):
        raw = b"".join(r.iter_raw())
    thread.join(300)
    first_event_end = raw.index(b"\n\n")
    assert raw[:first_event_end].startswith(b"id: 1\n")
    assert raw[first_event_end + 2 :].startswith(b": keep-alive\n: keep-alive\n"), raw[:400]
    assert b": keep-alive\n\n" not in raw
    assert iter_sse_bytes(raw)[-1].event == "response.incomplete"


def iter_sse_bytes(raw: bytes) -> list[SSE]:
    response = httpx.Response(200, content=raw)
    return [e for e in iter_sse(response) if isinstance(e, SSE)]


def test_problem_documents_carry_message(daemon: LiveDaemon, closing: Callable) -> None:
    r = httpx.post(daemon.url + "/responses", json=body(model="no-such-model"), headers=daemon.auth_headers, timeout=30)
    problem = r.json()
    assert r.status_code == 404 and problem["code"] == "model_not_found"
    assert problem["message"] == problem["detail"] and "no-such-model" in problem["message"]
    sdk = closing(openai.OpenAI(base_url=daemon.url, api_key=daemon.owner_token, max_retries=0))
    try:
        sdk.responses.create(model="no-such-model", input="hi")
    except openai.NotFoundError as exc:
        assert isinstance(exc.body, dict) and "no-such-model" in exc.body["message"]
    else:
        raise AssertionError("expected a 404")
