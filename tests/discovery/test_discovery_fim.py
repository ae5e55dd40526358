"""Fill-in-the-middle tokens read from a GGUF header agree with what llama.cpp itself finds.

Each case writes a vocabulary-only GGUF and asks two readers: the header reader
(`GGUFInfo.fim_tokens`, what the listings show without loading a model) and
llama.cpp (a vocab-only load, `llama_vocab_fim_pre/suf/mid`: what the engine uses to
build a FIM prompt). They must agree, and the case must give the answer it expects.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import llama_cpp
import pytest
from gguf_factory import vocabulary

from lmsp_tray.discovery.gguf_header import read_gguf_info

QWEN = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
FILLER = [f"piece-{i}-{'x' * (i % 37)}" for i in range(5000)]  # many checkpoints before the FIM tokens


def _write(path: Path, extra: list[str], kv: dict[str, int] | None = None) -> Path:
    tokens, scores, types = vocabulary(control=extra)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    for key, value in (kv or {}).items():
        writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_cpp_finds_fim(path: Path) -> bool:
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load {path}"
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        ids = (
            llama_cpp.llama_vocab_fim_pre(vocab),
            llama_cpp.llama_vocab_fim_suf(vocab),
            llama_cpp.llama_vocab_fim_mid(vocab),
        )
        return min(ids) >= 0
    finally:
        llama_cpp.llama_model_free(model)


def _base() -> int:
    return len(vocabulary()[0])  # the id of the first extra token


CASES = {
    "no FIM tokens": ([], None, False),
    "named in metadata": (
        ["<a>", "<b>", "<c>"],
        {
            "tokenizer.ggml.fim_pre_token_id": 0,
            "tokenizer.ggml.fim_suf_token_id": 1,
            "tokenizer.ggml.fim_mid_token_id": 2,
        },
        True,
    ),
    "named by the deprecated keys": (
        ["<a>", "<b>", "<c>"],
        {"tokenizer.ggml.prefix_token_id": 0, "tokenizer.ggml.suffix_token_id": 1, "tokenizer.ggml.middle_token_id": 2},
        True,
    ),
    "ids out of range, no texts": (
        [],
        {
            "tokenizer.ggml.fim_pre_token_id": 10**6,
            "tokenizer.ggml.fim_suf_token_id": 10**6,
            "tokenizer.ggml.fim_mid_token_id": 10**6,
        },
        False,
    ),
    "Qwen texts": (QWEN, None, True),
    "Qwen texts far into a big vocabulary": ([*FILLER[:4097], QWEN[0], *FILLER[4097:], *QWEN[1:]], None, True),
    "StarCoder texts": (["<fim_prefix>", "<fim_middle>", "<fim_suffix>"], None, True),
    "DeepSeek texts": (["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"], None, True),
    "CodeLlama texts": (["▁<PRE>", "▁<SUF>", "▁<MID>"], None, True),
    "texts of different families": (["<fim-prefix>", "<|code_suffix|>", "<|middle|>"], None, True),
    "one named, two by text": (
        ["<x>", "<|fim_suffix|>", "<|fim_middle|>"],
        {"tokenizer.ggml.fim_pre_token_id": 0},
        True,
    ),
    "no middle token": (QWEN[:2], None, False),
    "texts only inside other tokens": (["a<|fim_prefix|>", "<|fim_suffix|>b", "<|fim_middle|> "], None, False),
    # The bytes a search looks for (an 8-byte length, then the text) inside another token: not a token.
    "a token's bytes inside another token": (
        ["z\x0e\x00\x00\x00\x00\x00\x00\x00<|fim_prefix|>", QWEN[1], QWEN[2]],
        None,
        False,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_header_and_llama_cpp_agree(tmp_path: Path, case: str) -> None:
    extra, kv, expected = CASES[case]
    if kv is not None:
        kv = {k: v if v >= 10**6 else _base() + v for k, v in kv.items()}
    path = _write(tmp_path / "vocab.gguf", extra, kv)
    assert read_gguf_info(path).fim_tokens is expected
    assert _llama_cpp_finds_fim(path) is expected


def test_header_cache_keeps_the_answer(tmp_path: Path) -> None:
    """The catalog's header cache stores the field with the others (its schema names every field)."""
    from lmsp_tray.discovery.scan import Header, HeaderCache

    path = _write(tmp_path / "qwen.gguf", QWEN)
    cache = HeaderCache(tmp_path / "cache.json")
    cache.put(str(path), 1, 2, Header(read_gguf_info(path), None))
    cache.save({str(path)})
    again = HeaderCache(tmp_path / "cache.json").get(str(path), 1, 2)
    assert again is not None and again.info is not None and again.info.fim_tokens is True
