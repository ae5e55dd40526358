"""The embedder in process, on real llama.cpp: every pooling path equals llama-cpp-python's own embeddings.

- an encoder with mean pooling (the common BERT case),
- an encoder whose GGUF declares no pooling: the mean of the token vectors, computed here,
- a decoder that declares last-token pooling (as Qwen3-Embedding does): it has a KV cache, which every
  decode starts afresh,

and discovery's rule for what is an embedding model, and a cancelled job stopping within a decode.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf_factory import write_tiny_bert_gguf, write_tiny_gguf

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.embedding import POOLING_LAST, POOLING_MEAN, POOLING_NONE, EmbedCancel
from lmsp_tray.errors import InputTooLong, RequestCancelled, UnsupportedCapability
from lmsp_tray.runner.model import LlamaModel, LoadOptions
from lmsp_tray.runner.runtime import Runtime

TEXTS = ["hello world", "the cat sat on the mat", "zebra", "a model of the local service is a test"]


def load(path: Path) -> LlamaModel:
    entry = ModelEntry(path.stem, path, "custom", path.stat().st_size, (path,), read_gguf_info(path))
    return LlamaModel(Runtime(), entry, LoadOptions(threads=1))


def reference(path: Path, texts: list[str]) -> np.ndarray:
    llm = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_threads=1, n_ctx=512)
    try:
        out = []
        for text in texts:  # one at a time: the reference must not depend on batching
            vector = np.array(llm.embed(text), dtype=np.float64)
            out.append(vector.mean(axis=0) if vector.ndim == 2 else vector)  # pooling none: token vectors
    finally:
        llm.close()
    vectors = np.array(out)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    folder = tmp_path_factory.mktemp("embedders")
    yield {
        "mean": write_tiny_bert_gguf(folder / "mean.gguf"),
        "none": write_tiny_bert_gguf(folder / "none.gguf", pooling_type=None, seed=3),
        "last": write_tiny_gguf(
            folder / "last.gguf", chat_template=None, basename="last-embed", extra_kv={"llama.pooling_type": 3}
        ),
    }


@pytest.mark.parametrize(("kind", "pooling"), [("mean", POOLING_MEAN), ("none", POOLING_NONE), ("last", POOLING_LAST)])
def test_each_pooling_equals_llama_cpp_python(models: dict[str, Path], kind: str, pooling: int) -> None:
    path = models[kind]
    model = load(path)
    try:
        assert model.embedder is not None and model.embedder.pooling == pooling
        got = model.embed(TEXTS * 5)  # 20 inputs, batched together
        assert got.vectors.shape[0] == 20 and got.token_counts[:4] == tuple(
            len(model.tokenize(t, add_special=True, parse_special=False)) for t in TEXTS
        )
        assert np.allclose(np.linalg.norm(got.vectors, axis=1), 1.0, atol=1e-5)
        cosines = (got.vectors[:4] * reference(path, TEXTS)).sum(axis=1)
        assert cosines.min() >= 0.9999, cosines
        assert np.allclose(got.vectors[:4], got.vectors[16:], atol=1e-5)  # the same in any batch position
        assert model.embedder.steps <= 2  # 20 inputs, not 20 decodes
        with pytest.raises(UnsupportedCapability):
            model.submit(None)  # type: ignore[arg-type]  # refused before looking at the job
        with pytest.raises(InputTooLong) as long:
            model.embed(["hello", "hello " * 600])
        assert long.value.param == "input[1]"
    finally:
        model.close()


def test_what_counts_as_an_embedding_model() -> None:
    assert GGUFInfo(architecture="bert").embeddings  # encoders, with or without pooling_type
    assert GGUFInfo(architecture="nomic-bert", pooling_type=1).embeddings
    assert GGUFInfo(architecture="qwen3", pooling_type=3).embeddings  # a decoder that says how to pool
    assert not GGUFInfo(architecture="qwen3").embeddings
    assert not GGUFInfo(architecture="llama", pooling_type=0).embeddings
    assert not GGUFInfo(architecture="bert", pooling_type=4).embeddings  # a reranker


def test_a_cancelled_job_stops_within_a_decode_and_frees_its_place(models: dict[str, Path]) -> None:
    """The client of a large batch went away after the first decode: the embedder drops the inputs left,
    answers the job `RequestCancelled` and embeds the next job; counted in decodes and inputs, not time."""
    path = models["mean"]
    cancel = EmbedCancel()
    decodes: list[int] = []

    def on_step() -> None:  # after every pass of the embedder's loop, on its thread
        decodes.append(1)
        if len(decodes) == 1:
            cancel.cancel()  # the first decode of the batch is done: the client leaves now

    entry = ModelEntry(path.stem, path, "custom", path.stat().st_size, (path,), read_gguf_info(path))
    model = LlamaModel(Runtime(), entry, LoadOptions(threads=1), on_step=on_step)
    try:
        embedder = model.embedder
        assert embedder is not None
        long = model.tokenize("hello " * 100, add_special=True, parse_special=False)[:100]
        assert len(long) == 100
        batch = [long] * 200  # five inputs fill a decode (512 tokens): 40 decodes in all
        with pytest.raises(RequestCancelled):
            model.embed(batch, cancel=cancel)
        assert embedder.steps == 1 and sum(embedder.sequences) == 5  # one decode of 5, not 200 inputs
        assert not embedder.busy and embedder.queued == 0 and model.stats().cancelled == 1
        got = model.embed(TEXTS)  # the next request runs at once, with only its own inputs
        assert got.vectors.shape[0] == len(TEXTS) and sum(embedder.sequences) == 5 + len(TEXTS)
        # A cancel before the job starts: nothing is decoded at all.
        early = EmbedCancel()
        early.cancel()
        steps = embedder.steps
        with pytest.raises(RequestCancelled):
            model.embed(batch, cancel=early)
        assert embedder.steps == steps and not embedder.busy and model.stats().cancelled == 2
        # Cancelling a finished job changes nothing.
        done = EmbedCancel()
        assert model.embed(TEXTS, cancel=done).vectors.shape[0] == len(TEXTS)
        done.cancel()
        assert model.embed(TEXTS).vectors.shape[0] == len(TEXTS) and model.stats().cancelled == 2
    finally:
        model.close()
