"""Stored responses and conversations over HTTP, with real llama.cpp on a generated GGUF.

`store: true` keeps a response (GET / DELETE), `previous_response_id`
continues from one: the context is the stored chain plus the new input,
and the loaded model reuses the chain's prefix from its KV cache.
"""

from __future__ import annotations

import httpx
import pytest
from support import TINY_ID, body, events

pytestmark = pytest.mark.shared_daemon  # the tests share the module's daemon (conftest.py)


def text_of(response: dict) -> str:
    return "".join(p["text"] for item in response["output"] if item["type"] == "message" for p in item["content"])


def test_capability_is_advertised(client: httpx.Client) -> None:
    assert "conversations" in client.get("").json()["capabilities"]


def test_store_get_delete(client: httpx.Client) -> None:
    made = client.post("/responses", json=body("remember me", max_output_tokens=6, store=True))
    assert made.status_code == 200
    doc = made.json()
    got = client.get(f"/responses/{doc['id']}")
    assert got.status_code == 200 and got.headers["lmsp-version"] == "1.0"
    assert got.json() == doc

    gone = client.delete(f"/responses/{doc['id']}")
    assert gone.status_code == 200
    assert gone.json() == {"id": doc["id"], "object": "response.deleted", "deleted": True}
    for r in (client.get(f"/responses/{doc['id']}"), client.delete(f"/responses/{doc['id']}")):
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "response_not_found"


def test_not_stored_without_store(client: httpx.Client) -> None:
    doc = client.post("/responses", json=body("ephemeral", max_output_tokens=3)).json()
    r = client.get(f"/responses/{doc['id']}")
    assert r.status_code == 404 and r.json()["code"] == "response_not_found"
    r = client.post("/responses", json=body("more", previous_response_id=doc["id"]))
    assert r.status_code == 404 and r.json()["code"] == "response_not_found"
    assert r.json()["param"] == "previous_response_id"
    assert client.get("/responses/resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF").status_code == 404


def test_streamed_response_is_stored_before_its_terminal_event(client: httpx.Client) -> None:
    with client.stream(
        "POST", "/responses", json=body("stream and keep", max_output_tokens=6, stream=True, store=True)
    ) as r:
        for e in events(r):
            if e.event in ("response.completed", "response.incomplete"):
                # The connection is still open: the stored copy must already be readable.
                got = client.get(f"/responses/{e.data['response_id']}")
                assert got.status_code == 200
                assert got.json() == e.data["response"]


def test_three_turn_conversation(daemon_factory) -> None:
    live = daemon_factory(parallel=2)
    turns = ["Tell me about lighthouses.", "And about the sea?", "Summarise both."]
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        previous = None
        docs = []
        for text in turns:
            extra = {"previous_response_id": previous} if previous else {}
            r = c.post("/responses", json=body(text, max_output_tokens=8, store=True, **extra))
            assert r.status_code == 200, r.text
            doc = r.json()
            docs.append(doc)
            previous = doc["id"]
        first, second, third = (d["usage"] for d in docs)
        # Each turn's context holds the earlier inputs and outputs plus its own input.
        assert second["input_tokens"] > first["input_tokens"] + first["output_tokens"]
        assert third["input_tokens"] > second["input_tokens"] + second["output_tokens"]
        # The same loaded model evaluated each earlier prompt already: that prefix came from its KV cache.
        assert first["input_tokens_details"]["cached_tokens"] == 0
        assert second["input_tokens_details"]["cached_tokens"] >= first["input_tokens"]
        assert third["input_tokens_details"]["cached_tokens"] >= second["input_tokens"]

        # Sending the whole conversation explicitly renders the very same prompt.
        explicit = []
        for text, doc in zip(turns, docs[:2]):
            explicit += [
                {"role": "user", "content": text},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text_of(doc)}]},
            ]
        explicit.append({"role": "user", "content": turns[2]})
        r = c.post("/responses", json={"model": TINY_ID, "input": explicit, "temperature": 0, "max_output_tokens": 8})
        assert r.status_code == 200
        assert r.json()["usage"]["input_tokens"] == third["input_tokens"]

        # Every turn is stored with its own link.
        for doc in docs:
            assert c.get(f"/responses/{doc['id']}").json() == doc

        # A missing link anywhere in the chain is an error, not a silently shorter context.
        assert c.delete(f"/responses/{docs[0]['id']}").status_code == 200
        r = c.post("/responses", json=body("again", previous_response_id=docs[2]["id"]))
        assert r.status_code == 404 and r.json()["code"] == "response_not_found"


def test_instructions_are_not_carried_over(client: httpx.Client) -> None:
    first = client.post(
        "/responses", json=body("hi", instructions="Answer briefly.", max_output_tokens=4, store=True)
    ).json()
    plain = client.post("/responses", json=body("next", previous_response_id=first["id"], max_output_tokens=4)).json()
    again = client.post(
        "/responses",
        json=body("next", previous_response_id=first["id"], max_output_tokens=4, instructions="Answer briefly."),
    ).json()
    assert again["usage"]["input_tokens"] > plain["usage"]["input_tokens"]


def test_chain_longer_than_the_window(daemon_factory) -> None:
    live = daemon_factory()
    chunk = "the keeper climbs the stairs and lights the lamp " * 2
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        previous = None
        sizes = []
        for _ in range(12):
            extra = {"previous_response_id": previous} if previous else {}
            r = c.post("/responses", json=body(chunk, max_output_tokens=2, store=True, **extra))
            if r.status_code != 200:
                break
            sizes.append(r.json()["usage"]["input_tokens"])
            previous = r.json()["id"]
        else:
            raise AssertionError(f"the chain never outgrew the window: {sizes}")
        assert r.status_code == 400, r.text
        problem = r.json()
        assert problem["code"] == "context_length_exceeded"
        assert problem["param"] == "previous_response_id"
        assert previous in problem["detail"]
        assert len(sizes) >= 2 and sizes == sorted(sizes)
        # The same new input alone fits.
        assert c.post("/responses", json=body(chunk, max_output_tokens=2)).status_code == 200
