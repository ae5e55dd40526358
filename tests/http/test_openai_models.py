"""`/v1/models` over real HTTP: OpenAI's model objects, its error object, the same tokens and scopes as /lmsp/v1."""

from __future__ import annotations

import httpx
from support import TINY_ID, LiveDaemon


def test_v1_lists_models_in_openai_shape(daemon: LiveDaemon) -> None:
    with httpx.Client(base_url=daemon.base + "/v1", timeout=30, headers=daemon.auth_headers) as c:
        listing = c.get("/models")
        assert listing.status_code == 200
        body = listing.json()
        assert body["object"] == "list"
        tiny = next(m for m in body["data"] if m["id"] == TINY_ID)
        assert tiny["object"] == "model" and tiny["created"] > 0 and isinstance(tiny["owned_by"], str)
        assert tiny["context_length"] > 0
        one = c.get(f"/models/{TINY_ID}")
        assert one.status_code == 200 and one.json()["id"] == TINY_ID
        missing = c.get("/models/no-such-model")
        assert missing.status_code == 404
        error = missing.json()["error"]
        assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
        assert "no-such-model" in error["message"] and "Traceback" not in missing.text


def test_v1_needs_the_same_bearer_token(daemon: LiveDaemon) -> None:
    r = httpx.get(daemon.base + "/v1/models", timeout=30)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized" and r.json()["error"]["type"] == "authentication_error"
    r = httpx.get(daemon.base + "/v1/models", timeout=30, headers={**daemon.auth_headers, "Host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host"
