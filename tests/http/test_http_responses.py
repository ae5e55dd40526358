"""POST /responses over a real socket, with real llama.cpp on a generated GGUF."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from support import SLOW_ID, SSE, TINY_ID, body, events, iter_sse, wait_until

pytestmark = pytest.mark.shared_daemon  # the tests share the module's daemon (conftest.py)


def test_sync_response_shape(client: httpx.Client) -> None:
    r = client.post("/responses", json=body(max_output_tokens=6))
    assert r.status_code == 200
    assert r.headers["lmsp-version"] == "1.0"
    doc = r.json()
    assert set(doc) >= {
        "id",
        "object",
        "created_at",
        "status",
        "model",
        "output",
        "usage",
        "error",
        "incomplete_details",
    }
    assert doc["id"].startswith("resp_") and len(doc["id"]) == 31
    assert doc["object"] == "response" and doc["model"] == TINY_ID
    assert doc["status"] == "incomplete"
    assert doc["incomplete_details"] == {"reason": "max_output_tokens"}
    assert doc["error"] is None
    [item] = doc["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["id"].startswith("msg_")
    [part] = item["content"]
    assert part["type"] == "output_text" and part["text"]
    usage = doc["usage"]
    assert usage["output_tokens"] == 6
    assert usage["input_tokens"] > 5
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_stop_sequence_completes(client: httpx.Client) -> None:
    # Find what the model says at temperature 0, then stop on a piece of it.
    first = client.post("/responses", json=body(max_output_tokens=12)).json()
    text = first["output"][0]["content"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop
    doc = client.post("/responses", json=body(max_output_tokens=12, extensions={"lmsp_tray": {"stop": [stop]}})).json()
    assert doc["status"] == "completed", doc
    assert doc["incomplete_details"] is None
    assert doc["output"][0]["content"][0]["text"] == text[: text.index(stop)]


def test_repeat_penalty_is_applied_and_the_model_keeps_serving(client: httpx.Client) -> None:
    def text(**options: object) -> str:
        r = client.post("/responses", json=body(max_output_tokens=40, extensions={"lmsp_tray": options}))
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "incomplete"
        return r.json()["output"][0]["content"][0]["text"]

    plain = text()
    penalised = text(repeat_penalty=1.8)
    assert penalised != plain  # the penalty changed what greedy decoding picks
    assert text(repeat_penalty=1.8, temperature=0.7, seed=3)
    assert text() == plain  # and the model's thread is still there, unchanged


def test_stream_event_order_and_ids(client: httpx.Client) -> None:
    with client.stream("POST", "/responses", json=body(max_output_tokens=8, stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["lmsp-version"] == "1.0"
        evs = events(r)
    ids = [e.id for e in evs]
    assert ids == list(range(1, len(evs) + 1))
    names = [e.event for e in evs]
    assert names[0] == "response.created"
    assert names[1] == "response.output_item.added"
    assert names[-1] == "response.incomplete"
    assert (
        sum(n in {"response.completed", "response.incomplete", "response.failed", "response.cancelled"} for n in names)
        == 1
    )
    assert names.index("response.output_item.done") < len(names) - 1
    rid = evs[0].data["response_id"]
    for e in evs:
        assert e.data["response_id"] == rid
        assert e.data["type"] == e.event and e.data["sequence_number"] == e.id
    created = evs[0].data
    assert created["status"] == "in_progress" and created["response"]["status"] == "in_progress"
    deltas = [e for e in evs if e.event == "response.output_text.delta"]
    assert len(deltas) >= 1
    item_id = evs[1].data["item"]["id"]
    assert all(
        d.data["item_id"] == item_id and d.data["output_index"] == 0 and d.data["content_index"] == 0 for d in deltas
    )
    done = next(e for e in evs if e.event == "response.output_item.done").data["item"]
    assert done["content"][0]["text"] == "".join(d.data["delta"] for d in deltas)
    final = evs[-1].data
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 8
    assert final["response"]["output"][0]["content"][0]["text"] == done["content"][0]["text"]


def test_stream_and_sync_agree(client: httpx.Client) -> None:
    sync = client.post("/responses", json=body(max_output_tokens=10)).json()
    with client.stream("POST", "/responses", json=body(max_output_tokens=10, stream=True)) as r:
        evs = events(r)
    text = "".join(e.data["delta"] for e in evs if e.event == "response.output_text.delta")
    assert text == sync["output"][0]["content"][0]["text"]
    counts = ("input_tokens", "output_tokens", "total_tokens")  # cached_tokens differs: the second run reuses
    assert {k: evs[-1].data["usage"][k] for k in counts} == {k: sync["usage"][k] for k in counts}


def test_utf8_deltas_concatenate_to_final_text(client: httpx.Client) -> None:
    # The tiny vocabulary has byte tokens, so sampling produces characters split over tokens
    # (and invalid sequences); every delta must still be valid text and add up exactly.
    seen_multibyte = False
    for seed in range(6):
        req = body(
            "ж€日本🙂 héllo",
            max_output_tokens=48,
            stream=True,
            temperature=1.5,
            extensions={"lmsp_tray": {"seed": seed, "top_k": 0, "top_p": 1.0, "min_p": 0.0}},
        )
        with client.stream("POST", "/responses", json=req) as r:
            raw_events = events(r)
        deltas = [e.data["delta"] for e in raw_events if e.event == "response.output_text.delta"]
        final = raw_events[-1].data["response"]["output"][0]["content"][0]["text"]
        assert "".join(deltas) == final
        for d in deltas:
            d.encode("utf-8")  # no lone surrogates: valid UTF-8
        seen_multibyte |= any(ord(ch) > 127 for ch in final)
    assert seen_multibyte


def test_context_overflow_before_any_byte(client: httpx.Client) -> None:
    long_text = "hello world " * 400
    r = client.post("/responses", json=body(long_text, stream=True))
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "context_length_exceeded"
    r = client.post("/responses", json=body("hi", max_output_tokens=100000))
    assert r.status_code == 400 and r.json()["param"] == "max_output_tokens"


@pytest.mark.parametrize(
    "payload, status, code, param",
    [
        (b"{", 400, "invalid_json", None),
        (b"", 400, "invalid_json", None),
        (b"\xff\xfe", 400, "invalid_json", None),
        (b"[1, 2]", 400, "invalid_request", None),
        (b'{"input": "hi"}', 400, "invalid_request", "model"),
        (b'{"model": "tiny-test:1m-f32"}', 400, "invalid_request", "input"),
        (b'{"model": "tiny-test:1m-f32", "input": 5}', 400, "invalid_request", "input"),
        (
            b'{"model": "tiny-test:1m-f32", "input": "x", "max_output_tokens": "many"}',
            400,
            "invalid_request",
            "max_output_tokens",
        ),
        (b'{"model": "tiny-test:1m-f32", "input": "x", "temperature": 7}', 400, "invalid_request", "temperature"),
        (b'{"model": "tiny-test:1m-f32", "input": "x", "stream": "yes"}', 400, "invalid_request", "stream"),
        (
            b'{"model": "tiny-test:1m-f32", "input": [{"type": "message", "role": "robot", "content": "x"}]}',
            400,
            "invalid_request",
            "input[0].role",
        ),
        (
            (
                b'{"model": "tiny-test:1m-f32", "input": [{"type": "message", "role": "user", "content": [{"type": '
                b'"input_text", "text": 3}]}]}'
            ),
            400,
            "invalid_request",
            "input[0].content[0].text",
        ),
        (b'{"model": "tiny-test:1m-f32", "input": [{"type": "telepathy"}]}', 400, "invalid_request", "input[0]"),
        (
            (
                b'{"model": "tiny-test:1m-f32", "input": [{"role": "user", "content": [{"type": "input_image", '
                b'"image_url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII="}]}]}'
            ),
            400,
            "unsupported_capability",
            "input[0].content[0]",
        ),
        (
            b'{"model": "tiny-test:1m-f32", "input": "x", "extensions": {"lmsp_tray": {"top_k": -1}}}',
            400,
            "invalid_request",
            "extensions.lmsp_tray.top_k",
        ),
        (b'{"model": "no-such-model", "input": "x"}', 404, "model_not_found", "model"),
    ],
)
def test_bad_requests_get_problem_documents(
    client: httpx.Client, payload: bytes, status: int, code: str, param: str | None
) -> None:
    r = client.post("/responses", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["lmsp-version"] == "1.0"
    doc = r.json()
    assert doc["code"] == code and doc["status"] == status
    assert doc["type"] == f"urn:lmsp:error:{code}"
    assert doc["title"] and doc["detail"]
    assert doc.get("param") == param
    assert "Traceback" not in r.text and 'File "' not in r.text


def test_routing_errors_and_version(client: httpx.Client) -> None:
    r = client.get("/nothing-here")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = client.get("/responses")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]
    r = client.get("", headers={"LMSP-Version": "2.0"})
    assert r.status_code == 400 and r.json()["code"] == "unsupported_version"
    r = client.get("", headers={"LMSP-Version": "1.0"})
    assert r.status_code == 200 and r.headers["lmsp-version"] == "1.0"


def test_liberal_inputs(client: httpx.Client) -> None:
    """Shapes existing Responses clients send: no item type, string content, developer role, instructions."""
    payload = {
        "model": TINY_ID,
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "You are terse."},
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "again"}]},
        ],
        "max_output_tokens": 3,
        "metadata": {"unknown": "fields are ignored"},
        "temperature": 0,
    }
    r = client.post("/responses", json=payload)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 3


def test_disconnect_stops_generation_and_next_request_starts(daemon_factory) -> None:
    live = daemon_factory(parallel=1)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        c.post(f"/models/{SLOW_ID}/load").raise_for_status()
        sched = live.scheduler(SLOW_ID)
        with c.stream("POST", "/responses", json=body(model=SLOW_ID, max_output_tokens=4000, stream=True)) as r:
            got = 0
            for e in iter_sse(r):
                if isinstance(e, SSE) and e.event == "response.output_text.delta":
                    got += 1
                    if got == 5:
                        break
        # The connection is closed: generation must stop within a decode step.
        wait_until(lambda: sched.generating == 0, 5, "the generation to stop", interval=0.01)
        steps = sched.steps
        time.sleep(0.5)
        assert sched.steps == steps, "decoding went on after the client left"
        assert steps < 2000
        # The next request runs at once (the only slot is free again).
        r = c.post("/responses", json=body(model=SLOW_ID, max_output_tokens=3))
        assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 3


def test_sync_disconnect_cancels(daemon_factory) -> None:
    live = daemon_factory(parallel=1)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        c.post(f"/models/{SLOW_ID}/load").raise_for_status()
    sched = live.scheduler(SLOW_ID)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{live.url}/responses",
            json=body(model=SLOW_ID, max_output_tokens=4000),
            timeout=0.5,
            headers=live.auth_headers,
        )
    wait_until(lambda: sched.generating == 0, 5, "the generation to stop", interval=0.01)
    steps = sched.steps
    time.sleep(0.3)
    assert sched.steps == steps


def test_fifo_queue_and_429(daemon_factory) -> None:
    """One slot, two queued: they get the slot in the order they came.

    Each stream holds the slot (a long generation) until the test lets it go, so the
    order the client threads see their first delta is the order the scheduler admitted
    them, whatever the machine's thread scheduling does with short answers.
    """
    live = daemon_factory(parallel=1, max_queue=2)
    order: list[str] = []
    lock = threading.Lock()
    release = {name: threading.Event() for name in ("first", "second", "third")}

    def run(name: str) -> None:
        payload = body(model=SLOW_ID, max_output_tokens=4000, stream=True)
        with (
            httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as own,
            own.stream("POST", "/responses", json=payload) as r,
        ):
            for e in iter_sse(r):
                if isinstance(e, SSE) and e.event == "response.output_text.delta":
                    with lock:
                        order.append(name)
                    release[name].wait(120)
                    return  # leaving cancels the long generation and frees the slot

    with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c:
        c.post(f"/models/{SLOW_ID}/load").raise_for_status()
        sched = live.scheduler(SLOW_ID)
        first = threading.Thread(target=run, args=("first",))
        first.start()
        wait_until(lambda: order, 120, "the first stream's first delta", interval=0.005)
        threads = []
        for name in ("second", "third"):
            t = threading.Thread(target=run, args=(name,))
            t.start()
            threads.append(t)
            wait_until(lambda: sched.queued == len(threads), 30, f"{len(threads)} queued requests", interval=0.005)
        r = c.post("/responses", json=body(model=SLOW_ID, max_output_tokens=2))
        assert r.status_code == 429
        assert r.json()["code"] == "too_many_requests"
        assert int(r.headers["retry-after"]) >= 1
        for held, following in (("first", 2), ("second", 3)):
            release[held].set()
            wait_until(lambda n=following: len(order) >= n, 120, f"stream {following}'s first delta", interval=0.005)
        release["third"].set()
        for t in [first, *threads]:
            t.join(120)
    assert order == ["first", "second", "third"]


@pytest.mark.shared_daemon(False)  # it changes the daemon
def test_models_endpoints(client: httpx.Client) -> None:
    listing = client.get("/models").json()
    assert listing["object"] == "list"
    [model] = [m for m in listing["data"] if m["id"] == TINY_ID]
    assert model["object"] == "model" and model["state"] == "available"
    assert model["architecture"] == "llama" and model["context_length"] == 512
    assert {"text", "streaming"} <= set(model["capabilities"])
    assert model["size_bytes"] > 0 and model["error"] is None
    r = client.post(f"/models/{TINY_ID}/load")
    assert r.status_code == 200 and r.json()["state"] == "loaded"
    loaded = r.json()["extensions"]["lmsp_tray"]
    assert loaded["device"] == "cpu" and loaded["gpu_layers"] == 0 and loaded["total_layers"] == 3
    [cpu] = loaded["devices"]  # the CPU build: all of it on the CPU
    assert cpu["name"] == "CPU" and cpu["type"] == "cpu" and cpu["memory_bytes"] == loaded["memory_bytes"] > 0
    assert client.get(f"/models/{TINY_ID}").json()["state"] == "loaded"
    r = client.post(f"/models/{TINY_ID}/unload")
    assert r.status_code == 200 and r.json()["state"] == "available"
    r = client.get("/models/nope:1b")
    assert r.status_code == 404 and r.json()["code"] == "model_not_found"
    r = client.post("/models/nope:1b/load")
    assert r.status_code == 404


def test_service_document(client: httpx.Client) -> None:
    doc = client.get("").json()
    assert doc["object"] == "service" and doc["lmsp_version"] == "1.0" and doc["versions"] == ["1.0"]
    assert doc["service"]["name"] == "lmsp-tray"
    assert "streaming" in doc["capabilities"]
    assert doc["auth"]["type"] == "bearer"
    assert doc["limits"]["max_request_bytes"] > 0
    hardware = doc["extensions"]["lmsp_tray"]  # what llama.cpp was built for and sees (the CPU build here)
    assert hardware["backend"] == "cpu" and hardware["gpu_offload"] is False and "device_error" not in hardware
    [cpu] = [d for d in hardware["devices"] if d["type"] == "cpu"]
    assert cpu["name"] == "CPU" and cpu["backend"] == "cpu"
    assert cpu["memory_total_bytes"] >= cpu["memory_free_bytes"] > 0
    assert "/" not in str(doc["service"]) and "home" not in str(doc).lower()
