"""Greedy sampling's argmax shortcut picks exactly the token llama.cpp's greedy sampler picks.

Real llama.cpp on the generated model and on Gemma 3: the context is driven
directly (the model's scheduler stopped), and at every step the shortcut's
token is compared with a llama.cpp greedy chain's on the same logits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner.model import LlamaModel, LoadOptions
from lmsp_tray.runner.runtime import Runtime
from lmsp_tray.runner.sampler import Sampler


def _bare_model(path: Path) -> LlamaModel:
    entry = ModelEntry(path.stem, path, "custom", path.stat().st_size, (path,), read_gguf_info(path))
    model = LlamaModel(Runtime(), entry, LoadOptions(parallel=1, threads=1))
    assert model.scheduler is not None
    model.scheduler.stop()  # the test drives the context itself
    return model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    from gguf_factory import write_tiny_gguf

    model = _bare_model(write_tiny_gguf(tmp_path_factory.mktemp("s") / "tiny.gguf", output_scale=0.3))
    yield model
    model.close()


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path) -> Iterator[LlamaModel]:
    model = _bare_model(gemma_gguf)
    yield model
    model.close()


def _decode(model: LlamaModel, tokens: list[int], pos: int) -> None:
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(model.ctx, batch) == 0
    finally:
        llama_cpp.llama_batch_free(batch)


def _compare(model: LlamaModel, prompt: str, steps: int) -> list[int]:
    llama_cpp.llama_memory_clear(model.memory, True)
    fast = Sampler(model.vocab, SamplingParams(temperature=0.0))
    assert fast._argmax
    chain_params = llama_cpp.llama_sampler_chain_default_params()
    reference = llama_cpp.llama_sampler_chain_init(chain_params)
    llama_cpp.llama_sampler_chain_add(reference, llama_cpp.llama_sampler_init_greedy())
    tokens = model.tokenize(prompt)
    _decode(model, tokens, 0)
    picked = []
    try:
        for step in range(steps):
            token = fast.sample(model.ctx, -1)
            assert token == llama_cpp.llama_sampler_sample(reference, model.ctx, -1), (prompt, step)
            picked.append(token)
            _decode(model, [token], len(tokens) + step)
    finally:
        fast.close()
        llama_cpp.llama_sampler_free(reference)
    return picked


def test_argmax_equals_llama_greedy_on_the_generated_model(tiny_model: LlamaModel) -> None:
    runs = [_compare(tiny_model, prompt, 40) for prompt in ("hello world", "the local model", "a test of the")]
    assert len({tuple(r) for r in runs}) > 1  # different prompts really led different ways


@pytest.mark.gemma
def test_argmax_equals_llama_greedy_on_gemma(gemma: LlamaModel) -> None:
    _compare(gemma, "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n", 24)


def test_penalties_and_grammars_keep_the_chain(tiny_model: LlamaModel) -> None:
    cases = {
        SamplingParams(temperature=0.0): True,
        SamplingParams(temperature=0.0, repeat_penalty=1.1): False,
        SamplingParams(temperature=0.0, grammar='root ::= "a"'): False,
        SamplingParams(temperature=0.7, seed=1): False,
    }
    for params, expected in cases.items():
        sampler = Sampler(tiny_model.vocab, params)
        try:
            assert sampler._argmax is expected, params
        finally:
            sampler.close()


def _lockstep(model: LlamaModel, params: SamplingParams, prompt: str, steps: int) -> tuple[list[int], int]:
    """Sample with the shortlist and, on the same logits, with the grammar over the whole vocabulary;
    returns the tokens (they must agree at every step) and how many re-samples the shortlist settled."""
    llama_cpp.llama_memory_clear(model.memory, True)
    quick, whole = Sampler(model.vocab, params), Sampler(model.vocab, params)
    whole._enough = None  # never a shortlist: the grammar sees all 262k tokens
    settled = 0
    real = quick._shortlist_pick

    def counted(ctx, index):
        nonlocal settled
        token = real(ctx, index)
        settled += token is not None
        return token

    quick._shortlist_pick = counted  # type: ignore[method-assign]
    tokens = model.tokenize(prompt)
    _decode(model, tokens, 0)
    picked = []
    try:
        for step in range(steps):
            token = quick.sample(model.ctx, -1)
            assert token == whole.sample(model.ctx, -1), (params, step)
            if model.is_eog(token):
                break
            picked.append(token)
            _decode(model, [token], len(tokens) + step)
    finally:
        quick.close()
        whole.close()
    return picked, settled


@pytest.mark.gemma
def test_grammar_shortlists_pick_what_the_whole_vocabulary_would(gemma: LlamaModel) -> None:
    """A rejected free pick is re-sampled among the most likely tokens when that is provably the same
    pick: greedy and seeded sampling, a 3,000-value enum (a prefix tree) and a JSON object schema."""
    from lmsp_tray.chat.gbnf import Grammar
    from lmsp_tray.chat.schema import SchemaCompiler

    words = [f"{a}{b}{c}" for a in "bcdfgklmnprst" for b in "aeiou" for c in "bdgklmnprstvxz"][:3000]
    schemas = [
        {"type": "object", "properties": {"pick": {"enum": words}}, "required": ["pick"]},
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}},
    ]
    prompt = "<start_of_turn>user\nAnswer in JSON.<end_of_turn>\n<start_of_turn>model\n"
    settled_total = 0
    for schema in schemas:
        g = Grammar()
        rule = SchemaCompiler(g, schema).compile()
        for params in (
            SamplingParams(temperature=0.0, grammar=g.text(rule), grammar_root=rule),
            SamplingParams(temperature=0.8, seed=7, grammar=g.text(rule), grammar_root=rule),
        ):
            picked, settled = _lockstep(gemma, params, prompt, 24)
            assert picked
            settled_total += settled
    assert settled_total > 0  # the shortlist really decided some re-samples
