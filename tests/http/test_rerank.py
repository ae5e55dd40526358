"""`POST /v1/rerank` and `/rerank` over real HTTP on a generated BERT reranker run in its model process.

The reranker is BERT-shaped with `rank` pooling and a classifier head (as
bge-reranker is); llama-server `--reranking` (the same vendored llama.cpp)
serves the same file, and both answer the same scores for the same query and
documents (its default flash-attention setting). Results come sorted by
relevance; `top_n` and `return_documents` shape them; the listing marks the
model `rerank`; a chat request to it is a 400 naming the capability; an
embedding model, a chat model and bad bodies are refused; a client that
leaves stops its documents within a few decodes (counted in decodes, never
in seconds).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_bert_gguf, write_tiny_reranker_gguf
from support import TINY_ID, LiveDaemon, llama_server, wait_until

pytestmark = pytest.mark.timeout(300)

QUERY = "the cat sat on the mat"
DOCUMENTS = [
    "the cat sat on the mat",
    "blue sky and green sea",
    "hello world model",
    "apple banana",
    "a dog is on the mat",
    "fast local search service",
]
BATCH = 128  # long documents of ~500 tokens each: one decode per document


@pytest.fixture(scope="module")
def rerank_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_reranker_gguf(tmp_path_factory.mktemp("rerank") / "tiny-rerank-1m-f32.gguf")


@pytest.fixture(scope="module")
def wide_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wide")
    return write_tiny_reranker_gguf(folder / "wide-rerank-1m-f32.gguf", basename="wide-rerank", context_length=512)


@pytest.fixture(scope="module")
def live_files(tiny_gguf: Path, rerank_gguf: Path, wide_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """The module's `live` daemon serves a chat model, two rerankers and an embedding model."""
    embed = write_tiny_bert_gguf(tmp_path_factory.mktemp("embed") / "tiny-embed-1m-f32.gguf")
    return [tiny_gguf, rerank_gguf, wide_gguf, embed]


@pytest.fixture(scope="module")
def reference(rerank_gguf: Path) -> Iterator[str]:
    """llama-server --reranking on the same file: its base URL."""
    with llama_server(rerank_gguf, "--reranking") as base:
        yield base


def _ids(v1: httpx.Client) -> dict[str, list[str]]:
    return {m["id"]: m["capabilities"] for m in v1.get("/models").json()["data"]}


def _rerank_id(v1: httpx.Client, prefix: str = "tiny-rerank") -> str:
    return next(i for i, caps in _ids(v1).items() if caps == ["rerank"] and i.startswith(prefix))


def test_listings_mark_the_reranker(live: LiveDaemon, v1: httpx.Client) -> None:
    caps = _ids(v1)
    rerankers = [i for i, c in caps.items() if c == ["rerank"]]
    assert len(rerankers) == 2, caps
    lmsp = httpx.get(live.url + "/models", headers=live.auth_headers, timeout=30).json()["data"]
    assert {m["id"]: m["capabilities"] for m in lmsp} == caps
    assert "text" in caps[TINY_ID]


def test_scores_equal_llama_server(live: LiveDaemon, v1: httpx.Client, reference: str) -> None:
    model = _rerank_id(v1)
    theirs = httpx.post(reference + "/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=60).json()
    r = v1.post("/rerank", json={"model": model, "query": QUERY, "documents": DOCUMENTS})
    assert r.status_code == 200, r.text
    ours = r.json()
    assert ours["object"] == "list" and ours["model"] == model
    mine = {x["index"]: x["relevance_score"] for x in ours["results"]}
    expected = {x["index"]: x["relevance_score"] for x in theirs["results"]}
    assert set(mine) == set(range(len(DOCUMENTS)))
    for i, score in expected.items():
        assert mine[i] == pytest.approx(score, rel=5e-3, abs=5e-3), (i, mine, expected)
    scores = [x["relevance_score"] for x in ours["results"]]
    assert scores == sorted(scores, reverse=True)  # by relevance, highest first
    assert len(set(scores)) > 1  # the documents are told apart
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]  # the same pairs of tokens
    assert ours["usage"]["total_tokens"] == ours["usage"]["prompt_tokens"]
    # the root path, and documents as {text} objects, give the same answer
    root = httpx.post(
        live.base + "/rerank",
        json={"model": model, "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS]},
        headers=live.auth_headers,
        timeout=60,
    )
    assert root.status_code == 200, root.text
    assert [x["index"] for x in root.json()["results"]] == [x["index"] for x in ours["results"]]


def test_top_n_and_return_documents(live: LiveDaemon, v1: httpx.Client) -> None:
    model = _rerank_id(v1)
    full = v1.post("/rerank", json={"model": model, "query": QUERY, "documents": DOCUMENTS}).json()["results"]
    top = v1.post(
        "/rerank", json={"model": model, "query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": True}
    ).json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in full[:2]]
    assert [x["document"]["text"] for x in top] == [DOCUMENTS[x["index"]] for x in top]
    assert all("document" not in x for x in full)
    more = v1.post("/rerank", json={"model": model, "query": QUERY, "documents": DOCUMENTS, "top_n": 50}).json()
    assert len(more["results"]) == len(DOCUMENTS)


def test_refusals(live: LiveDaemon, v1: httpx.Client) -> None:
    model = _rerank_id(v1)
    embed_id = next(i for i, c in _ids(v1).items() if c == ["embeddings"])
    for other in (TINY_ID, embed_id):
        r = v1.post("/rerank", json={"model": other, "query": QUERY, "documents": DOCUMENTS})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_capability", r.text
    assert v1.post("/rerank", json={"model": "no-such", "query": "q", "documents": ["d"]}).status_code == 404
    for bad, param in (
        ({"model": model, "documents": ["d"]}, "query"),
        ({"model": model, "query": "q", "documents": []}, "documents"),
        ({"model": model, "query": "q", "documents": [""]}, "documents[0]"),
        ({"model": model, "query": "q", "documents": [3]}, "documents"),
        ({"model": model, "query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ):
        r = v1.post("/rerank", json=bad)
        assert r.status_code == 400, (bad, r.text)
        assert (r.json()["error"]["param"] or "").startswith(param), (bad, r.text)
    r = v1.post("/rerank", json={"model": model, "query": "q", "documents": ["hello " * 400]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[0]", r.text
    unauthorised = httpx.post(live.base + "/rerank", json={"model": model, "query": "q", "documents": ["d"]})
    assert unauthorised.status_code == 401
    # a chat request to the reranker names the capability instead of answering empty text
    for path, body in (
        ("/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        ("/completions", {"model": model, "prompt": "hi"}),
    ):
        r = v1.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "unsupported_capability" and "rerank" in r.json()["error"]["message"]


def _post_and_leave(live: LiveDaemon, body: dict, started) -> None:
    data = json.dumps(body).encode()
    port = int(live.base.rsplit(":", 1)[1])
    head = (
        f"POST /v1/rerank HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {live.owner_token}\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + data)
        wait_until(started, 120, "the model to begin the documents")


def test_a_client_that_leaves_stops_its_documents(live: LiveDaemon, v1: httpx.Client) -> None:
    model_id = _rerank_id(v1, "wide-rerank")
    assert v1.post("/rerank", json={"model": model_id, "query": "q", "documents": ["warm"]}).status_code == 200
    model = live.daemon.models.get(model_id)
    assert model is not None and model.context_length == 512
    long = "hello " * 480  # with the query, one pair fills most of one decode
    before = model.stats(batches=True)
    body = {"model": model_id, "query": QUERY, "documents": [long] * BATCH}
    _post_and_leave(live, body, lambda: model.stats().steps > before.steps)
    wait_until(lambda: model.stats().queued == 0 and not model.busy, 120, "the abandoned documents to stop")
    after = model.stats(batches=True)
    scored = sum(after.batch_sizes) - sum(before.batch_sizes)
    assert 1 <= scored < BATCH // 2, scored  # it stopped early, not after every document
    assert after.cancelled == before.cancelled + 1
    r = v1.post("/rerank", json={"model": model_id, "query": QUERY, "documents": DOCUMENTS[:2]})
    assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
    assert model.stats().pid == before.pid
