"""`POST /v1/embeddings` whose client leaves: the model process stops the batch and serves the next request.

A generated BERT with a 512-token window runs in its model process; a request
of many 500-token inputs needs one decode per input. The client sends it over
a plain socket and closes the socket once the model has begun (its decode
count moved); the model's own counters then say how many inputs it embedded
(few, not all) and that one request was cancelled; the next request is served.
Counted in decodes and inputs, never in seconds.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from gguf_factory import write_tiny_bert_gguf
from support import LiveDaemon, wait_until

pytestmark = pytest.mark.timeout(300)

BATCH = 256  # inputs of 500 tokens: one decode each, so the whole batch is 256 decodes


@pytest.fixture(scope="module")
def live_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The `live` daemon (conftest.py) serves one BERT with a 512-token window."""
    return [write_tiny_bert_gguf(tmp_path_factory.mktemp("embed") / "wide-embed-1m-f32.gguf", context_length=512)]


def _post_and_leave(live: LiveDaemon, body: dict, started: Callable[[], bool]) -> None:
    """POST `body` to /v1/embeddings over a socket, and close it (no answer read) once `started()`."""
    data = json.dumps(body).encode()
    port = int(live.base.rsplit(":", 1)[1])
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {live.owner_token}\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + data)
        wait_until(started, 120, "the model to begin the batch")


def test_a_client_that_leaves_stops_its_batch_and_the_next_request_is_served(
    live: LiveDaemon, v1: httpx.Client
) -> None:
    embed_id = next(m["id"] for m in v1.get("/models").json()["data"] if m["capabilities"] == ["embeddings"])
    assert v1.post("/embeddings", json={"model": embed_id, "input": "warm up"}).status_code == 200  # loaded
    model = live.daemon.models.get(embed_id)
    assert model is not None and model.context_length == 512
    long = model.tokenize_prompt("hello " * 600)[:500]
    assert len(long) == 500
    before = model.stats(batches=True)

    _post_and_leave(live, {"model": embed_id, "input": [long] * BATCH}, lambda: model.stats().steps > before.steps)
    wait_until(lambda: model.stats().queued == 0 and not model.busy, 120, "the abandoned batch to stop")
    after = model.stats(batches=True)
    embedded = sum(after.batch_sizes) - sum(before.batch_sizes)
    assert 1 <= embedded < BATCH // 2, embedded  # it stopped early: within a few decodes, not 256
    assert after.cancelled == before.cancelled + 1
    assert model.alive  # type: ignore[attr-defined]

    # The next request is served, with its own inputs only, by the same process.
    r = v1.post("/embeddings", json={"model": embed_id, "input": [long, "hello world"]})
    assert r.status_code == 200, r.text
    vectors = np.array([d["embedding"] for d in r.json()["data"]])
    assert vectors.shape == (2, 64) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    final = model.stats(batches=True)
    assert sum(final.batch_sizes) - sum(after.batch_sizes) == 2 and final.cancelled == after.cancelled
    assert final.pid == before.pid
