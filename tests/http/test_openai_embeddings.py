"""`POST /v1/embeddings` over real HTTP on a generated BERT model that llama.cpp runs in a model process.

The vectors equal llama-cpp-python's own `Llama(embedding=True)` on the same
file and texts (cosine >= 0.9999); the official openai SDK reads them as
floats and as base64; many inputs share few decodes; an input over the
window is refused naming its index (llama.cpp would abort the process);
an embedding model refuses generation and a chat model refuses embeddings.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from browser import (
    browser,  # noqa: F401 - fixture
    open_console,
)
from gguf_factory import write_tiny_bert_gguf
from support import TINY_ID, LiveDaemon

TEXTS = ["hello world", "the cat sat on the mat", "zebra quux", "Embedding search, fast and local!"]


@pytest.fixture(scope="module")
def bert_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert_gguf(tmp_path_factory.mktemp("embed") / "tiny-embed-1m-f32.gguf")


@pytest.fixture(scope="module")
def live_files(tiny_gguf: Path, bert_gguf: Path) -> list[Path]:
    """The module's `live` daemon (conftest.py) serves a chat model and an embedding model."""
    return [tiny_gguf, bert_gguf]


@pytest.fixture
def model_files(tiny_gguf: Path, bert_gguf: Path) -> list[Path]:
    return [tiny_gguf, bert_gguf]  # the same, for a test that needs a daemon of its own


def _embed_id(c: httpx.Client) -> str:
    data = c.get("/models").json()["data"]
    return next(m["id"] for m in data if m["capabilities"] == ["embeddings"])


def reference(path: Path, texts: list[str]) -> np.ndarray:
    """llama-cpp-python's own embeddings of `texts`, normalised."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_threads=1)
    try:
        vectors = np.array(llm.embed(texts), dtype=np.float64)
    finally:
        llm.close()
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_listings_mark_the_embedding_model(live: LiveDaemon, v1: httpx.Client) -> None:
    lmsp = httpx.get(live.url + "/models", headers=live.auth_headers, timeout=30).json()["data"]
    caps = {m["id"]: m["capabilities"] for m in lmsp}
    embed_id = _embed_id(v1)
    assert caps[embed_id] == ["embeddings"] and "text" in caps[TINY_ID]
    openai_caps = {m["id"]: m["capabilities"] for m in v1.get("/models").json()["data"]}
    assert openai_caps == caps


def test_vectors_equal_llama_cpp_python(live: LiveDaemon, v1: httpx.Client, bert_gguf: Path) -> None:
    embed_id = _embed_id(v1)
    r = v1.post("/embeddings", json={"model": embed_id, "input": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == embed_id
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    got = np.array([d["embedding"] for d in body["data"]])
    assert got.shape == (len(TEXTS), 64)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = (got * reference(bert_gguf, TEXTS)).sum(axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(TEXTS) * 2
    one = v1.post("/embeddings", json={"model": embed_id, "input": TEXTS[1]}).json()
    assert len(one["data"]) == 1 and np.allclose(one["data"][0]["embedding"], got[1], atol=1e-5)


def test_openai_sdk_float_and_base64(live: LiveDaemon, v1: httpx.Client, closing: Callable) -> None:
    import openai

    client = closing(openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0))
    embed_id = _embed_id(v1)
    floats = client.embeddings.create(model=embed_id, input=TEXTS, encoding_format="float")
    packed = client.embeddings.create(model=embed_id, input=TEXTS, encoding_format="base64")
    default = client.embeddings.create(model=embed_id, input=TEXTS)  # the SDK asks for base64 and decodes it
    a = np.array([d.embedding for d in floats.data])
    # asked for explicitly, base64 comes back as the strings themselves (little-endian float32)
    b = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in packed.data])  # type: ignore[arg-type]
    assert np.allclose(a, b, atol=1e-6)
    assert np.allclose(a, np.array([d.embedding for d in default.data]), atol=1e-6)
    raw = v1.post("/embeddings", json={"model": embed_id, "input": TEXTS[:1], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, a[0], atol=1e-6)
    assert floats.usage.prompt_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=TINY_ID, input="hi")
    assert refused.value.code == "unsupported_capability"
    with pytest.raises(openai.AuthenticationError):
        closing(openai.OpenAI(base_url=live.base + "/v1", api_key="nope", max_retries=0)).embeddings.create(
            model=embed_id, input="hi"
        )


def test_tokens_dimensions_and_limits(live: LiveDaemon, v1: httpx.Client) -> None:
    embed_id = _embed_id(v1)
    full = np.array(v1.post("/embeddings", json={"model": embed_id, "input": TEXTS}).json()["data"][0]["embedding"])
    # token arrays: [CLS] hello world [SEP] as the model's tokenizer gives them
    import llama_cpp

    model = live.daemon.models.get(embed_id)
    assert model is not None
    tokens = model.tokenize_prompt("hello world")
    del llama_cpp
    by_tokens = v1.post("/embeddings", json={"model": embed_id, "input": [tokens, tokens[:2]]})
    assert by_tokens.status_code == 200, by_tokens.text
    assert np.allclose(by_tokens.json()["data"][0]["embedding"], full, atol=1e-5)
    flat = v1.post("/embeddings", json={"model": embed_id, "input": tokens}).json()
    assert len(flat["data"]) == 1

    short = v1.post("/embeddings", json={"model": embed_id, "input": TEXTS, "dimensions": 16}).json()
    cut = np.array(short["data"][0]["embedding"])
    assert cut.shape == (16,) and np.isclose(np.linalg.norm(cut), 1.0, atol=1e-5)
    assert np.allclose(cut, full[:16] / np.linalg.norm(full[:16]), atol=1e-5)
    too_wide = v1.post("/embeddings", json={"model": embed_id, "input": "hi", "dimensions": 65})
    assert too_wide.status_code == 400 and too_wide.json()["error"]["param"] == "dimensions"

    long = " ".join(["hello"] * 300)  # 302 tokens; the window is 128: llama.cpp would abort on it
    over = v1.post("/embeddings", json={"model": embed_id, "input": ["hello", long]})
    assert over.status_code == 400, over.text
    error = over.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input[1]" and "Input 1" in error["message"]
    huge = v1.post("/embeddings", json={"model": embed_id, "input": ["x" * 300_000]})
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "input[0]"
    bad_token = v1.post("/embeddings", json={"model": embed_id, "input": [[1, 10**6]]})
    assert bad_token.status_code == 400 and bad_token.json()["error"]["param"] == "input[0]"
    for body, param in (
        ({"model": embed_id, "input": []}, "input"),
        ({"model": embed_id, "input": ""}, "input"),
        ({"model": embed_id, "input": ["a", 3.5]}, "input[1]"),
        ({"model": embed_id, "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ):
        r = v1.post("/embeddings", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # the model process survived every refusal
    again = v1.post("/embeddings", json={"model": embed_id, "input": "hello"})
    assert again.status_code == 200
    assert model.alive  # type: ignore[attr-defined]


def test_many_inputs_share_few_decodes(live: LiveDaemon, v1: httpx.Client) -> None:
    embed_id = _embed_id(v1)
    assert v1.post("/embeddings", json={"model": embed_id, "input": "warm up"}).status_code == 200  # loaded
    model = live.daemon.models.get(embed_id)
    assert model is not None
    before = model.stats(batches=True)
    texts = [f"{TEXTS[i % 4]} {i}" for i in range(100)]
    r = v1.post("/embeddings", json={"model": embed_id, "input": texts})
    assert r.status_code == 200 and len(r.json()["data"]) == 100
    stats = model.stats(batches=True)
    # inputs per decode: as many as fit 512 tokens (and 64 sequences), never one decode per input
    assert sum(stats.batch_sizes) - sum(before.batch_sizes) == 100 and stats.steps - before.steps <= 3, stats


def test_concurrent_requests_each_get_their_own_vectors(live: LiveDaemon, v1: httpx.Client) -> None:
    """Requests in flight together share the model's decodes; each answer still holds its own inputs."""
    from concurrent.futures import ThreadPoolExecutor

    embed_id = _embed_id(v1)
    batches = [[f"{TEXTS[(i + j) % 4]} {i}" for j in range(i + 1)] for i in range(8)]

    def alone(batch: list[str]) -> np.ndarray:
        r = v1.post("/embeddings", json={"model": embed_id, "input": batch})
        assert r.status_code == 200, r.text
        return np.array([d["embedding"] for d in r.json()["data"]])

    expected = [alone(b) for b in batches]
    steps = live.daemon.models.get(embed_id).stats().steps  # type: ignore[union-attr]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(alone, batches))
    for want, got in zip(expected, together, strict=True):
        # llama.cpp's kernels round a little differently for another batch shape: equal, not bitwise
        assert got.shape == want.shape and (got * want).sum(axis=1).min() >= 0.9999
    assert live.daemon.models.get(embed_id).stats().steps - steps <= len(batches)  # type: ignore[union-attr]


def test_embedding_model_does_not_generate(daemon_factory: Callable[..., LiveDaemon], v1: httpx.Client) -> None:
    live = daemon_factory()  # its own: nothing loaded yet
    embed_id = _embed_id(v1)
    r = httpx.post(live.url + "/responses", json={"model": embed_id, "input": "hi"}, headers=live.auth_headers)
    assert r.status_code == 400
    assert r.json()["code"] == "unsupported_capability" and "embedding model" in r.json()["detail"]
    assert live.daemon.models.get(embed_id) is None  # refused before loading anything


def test_console_chat_offers_only_models_that_generate(live: LiveDaemon, v1: httpx.Client, browser) -> None:
    console = open_console(live, browser)
    page = console.page
    console.view("chat")
    page.wait_for_selector(f"#chat-model option[value='{TINY_ID}']", state="attached")
    offered = page.eval_on_selector_all("#chat-model option", "els => els.map((e) => e.value)")
    assert TINY_ID in offered and _embed_id(v1) not in offered
    models_view = v1.get("/models").json()["data"]
    assert any(m["capabilities"] == ["embeddings"] for m in models_view)
    console.context.close()
    assert console.errors == []
