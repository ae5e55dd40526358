"""Idempotency-Key on POST /responses and POST /tasks, over HTTP with real llama.cpp."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from support import SLOW_ID, SSE, body, events, iter_sse, wait_until

from lmsp_tray.errors import IdempotencyKeyInProgress
from lmsp_tray.http.routes import caller_of
from lmsp_tray.http.security import STATE_TOKEN
from lmsp_tray.serving.replay import ANONYMOUS, Caller, Claim, Idempotency, Replay
from lmsp_tray.store import Database, TokenRecord, idempotency_keys

pytestmark = pytest.mark.shared_daemon  # the tests share the module's daemon (conftest.py)


def key(name: str) -> dict[str, str]:
    return {"Idempotency-Key": f"test-{name}-{time.monotonic_ns()}"}


def as_tuples(evs: list[SSE]) -> list[tuple]:
    return [(e.id, e.event, e.data) for e in evs]


def test_sync_replay_and_reuse(client: httpx.Client) -> None:
    k = key("sync")
    first = client.post("/responses", json=body("once", max_output_tokens=6, store=True), headers=k)
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    again = client.post("/responses", json=body("once", max_output_tokens=6, store=True), headers=k)
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    # Key order and whitespace do not make a different body.
    raw = b'{ "store": true, "max_output_tokens": 6, "temperature": 0, "input": "once", "model": "tiny-test:1m-f32" }'
    assert (
        client.post("/responses", content=raw, headers={**k, "content-type": "application/json"}).json() == first.json()
    )
    other = client.post("/responses", json=body("twice", max_output_tokens=6), headers=k)
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused" and other.json()["param"] == "Idempotency-Key"
    # Without a key, the same body runs again.
    assert client.post("/responses", json=body("once", max_output_tokens=6)).json()["id"] != first.json()["id"]


def test_streamed_original_replays_as_the_same_events(client: httpx.Client) -> None:
    k = key("stream")
    req = body("stream once", max_output_tokens=8, stream=True)
    with client.stream("POST", "/responses", json=req, headers=k) as r:
        original = events(r)
    with client.stream("POST", "/responses", json=req, headers=k) as r:
        assert r.status_code == 200 and r.headers["idempotent-replayed"] == "true"
        assert r.headers["content-type"].startswith("text/event-stream")
        replayed = events(r)
    assert as_tuples(replayed) == as_tuples(original)
    assert original[-1].event == "response.incomplete"


def test_in_progress_then_replay(daemon_factory) -> None:
    live = daemon_factory()
    k = key("busy")
    req = body("take your time", model=SLOW_ID, max_output_tokens=200, stream=True)
    with (
        httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c,
        httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as other,
    ):
        with c.stream("POST", "/responses", json=req, headers=k) as r:
            original = []
            for e in iter_sse(r):
                if isinstance(e, SSE):
                    original.append(e)
                    if len(original) == 4:
                        busy = other.post("/responses", json=req, headers=k)
                        assert busy.status_code == 409
                        assert busy.json()["code"] == "idempotency_key_in_progress"
                        busy = other.post("/responses", json=body("not the same", model=SLOW_ID), headers=k)
                        assert busy.status_code == 422
        with other.stream("POST", "/responses", json=req, headers=k) as r:
            assert r.headers["idempotent-replayed"] == "true"
            assert as_tuples(events(r)) == as_tuples(original)


def test_key_is_released_when_the_client_leaves_or_the_request_fails(daemon_factory) -> None:
    live = daemon_factory()
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        k = key("left")
        req = body("leave early", model=SLOW_ID, max_output_tokens=2000, stream=True)
        with c.stream("POST", "/responses", json=req, headers=k) as r:
            first_id = next(e for e in iter_sse(r) if isinstance(e, SSE)).data["response_id"]

        def retried() -> str | None:
            with c.stream("POST", "/responses", json=req, headers=k) as r:
                if r.status_code == 409:  # still claimed: the server has not noticed the disconnect yet
                    return None
                assert r.status_code == 200 and "idempotent-replayed" not in r.headers
                return next(e for e in iter_sse(r) if isinstance(e, SSE)).data["response_id"]

        retry_id = wait_until(retried, 30, "the key to be released", interval=0.05)
        assert retry_id != first_id

        k = key("fails")
        too_long = body("hello world " * 400)
        for _ in range(2):
            r = c.post("/responses", json=too_long, headers=k)
            assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded"


def test_tasks_replay(client: httpx.Client) -> None:
    k = key("task")
    req = body("a task once", max_output_tokens=4)
    first = client.post("/tasks", json=req, headers=k)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    again = client.post("/tasks", json=req, headers=k)
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert client.post("/tasks", json=body("another task"), headers=k).status_code == 422
    # One key, two endpoints: a reuse, not a replay.
    r = client.post("/responses", json=req, headers=k)
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    tasks = client.get("/tasks").json()["data"]
    assert sum(t["id"] == first.json()["id"] for t in tasks) == 1


def test_keys_and_stored_objects_belong_to_their_token(client: httpx.Client) -> None:
    made = client.post(
        "/auth/tokens",
        json={"name": "other-app", "scopes": ["responses:create", "responses:read", "tasks:create", "tasks:read"]},
    )
    assert made.status_code == 201, made.text
    other = {"Authorization": f"Bearer {made.json()['secret']}"}
    k = key("scoped")
    req = body("per token", max_output_tokens=3, store=True)
    mine = client.post("/responses", json=req, headers=k).json()
    theirs = client.post("/responses", json=req, headers={**k, **other})
    assert theirs.status_code == 200 and "idempotent-replayed" not in theirs.headers
    assert theirs.json()["id"] != mine["id"]  # the same key in another token's scope is another key
    assert client.get(f"/responses/{theirs.json()['id']}").status_code == 404
    assert client.get(f"/responses/{mine['id']}", headers=other).status_code == 404
    r = client.post("/responses", json=body("x", previous_response_id=mine["id"]), headers=other)
    assert r.status_code == 404 and r.json()["code"] == "response_not_found"
    task = client.post("/tasks", json=body("mine", max_output_tokens=2)).json()
    assert client.get(f"/tasks/{task['id']}", headers=other).status_code == 404
    assert task["id"] not in [t["id"] for t in client.get("/tasks", headers=other).json()["data"]]
    assert client.post(f"/tasks/{task['id']}/cancel", headers=other).status_code == 404


@pytest.mark.parametrize("bad", ["", "x" * 256, "caf\u00e9"])
def test_malformed_keys(client: httpx.Client, bad: str) -> None:
    r = client.post("/responses", json=body("x", max_output_tokens=1), headers={"Idempotency-Key": bad.encode("utf-8")})  # type: ignore[dict-item]
    assert r.status_code == 400 and r.json()["param"] == "Idempotency-Key"


def _request(token: object = None) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    if token is not None:
        scope["state"] = {STATE_TOKEN: token}  # where the security middleware puts the authorized token
    return Request(scope)


def test_keys_are_scoped_per_token(tmp_path: Path) -> None:
    """`caller_of` reads the token the security layer authorized; keys are scoped to it."""
    assert caller_of(_request()) == ANONYMOUS
    token = TokenRecord("tok_a", "app", ("responses:create",), time.time(), "0" * 64)
    assert caller_of(_request(token)) == Caller("tok_a", "tok_a")

    async def scenario(db: Database) -> None:
        keys = Idempotency(db)
        payload = {"model": "m", "input": "hi"}
        assert isinstance(await keys.claim(Caller("tok_a"), "k1", "responses", payload), Claim)
        assert isinstance(await keys.claim(Caller("tok_b"), "k1", "responses", payload), Claim)  # other token
        with pytest.raises(IdempotencyKeyInProgress):
            await keys.claim(Caller("tok_a"), "k1", "responses", payload)
        await db.awrite(idempotency_keys.finish, "tok_a", "k1", {"kind": "response", "status": 200, "body": {"id": 1}})
        replay = await keys.claim(Caller("tok_a"), "k1", "responses", payload)
        assert isinstance(replay, Replay) and replay.result["body"] == {"id": 1}

    with Database(tmp_path / "keys.sqlite3") as db:
        asyncio.run(scenario(db))
