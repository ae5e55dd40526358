"""Prompts tokenized in cached pieces give exactly llama.cpp's tokens, and only new pieces are tokenized.

The rules (`turn_markers`, `PromptTokenizer`) are unit-tested on their own; the
equality with whole-prompt tokenization is checked with real llama.cpp on the
generated SPM vocabulary (ChatML markers, plus a user-defined token that
overlaps a marker) and on Gemma 3's 262k-token vocabulary, over generated
conversations full of whitespace, partial markers and markers inside messages.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.runner.model import LlamaModel, LoadOptions, llama_longest_piece
from lmsp_tray.runner.prompt_tokens import PromptTokenizer, SpecialToken, can_overlap, turn_markers
from lmsp_tray.runner.runtime import Runtime

EXAMPLES = int(os.environ.get("LMSP_FUZZ_EXAMPLES", "25")) * 4


# -- the rules ------------------------------------------------------------------------------------
def test_overlap_covers_containment_and_partial_matches_on_either_side() -> None:
    assert can_overlap("<a>", "x<a>y")  # contains it
    assert can_overlap("<a>", "\n<a")  # ends inside it
    assert can_overlap("<a>", "a>\n")  # starts inside it
    assert not can_overlap("<a>", "<a>")
    assert not can_overlap("<a>", "<b>")
    assert not can_overlap("<start_of_turn>", "<unused12>")


def test_markers_are_control_tokens_of_the_template_nothing_longer_can_overlap() -> None:
    template = "{{ '<|im_start|>' + m + '<|im_end|>' }}<tab>"
    specials = [
        SpecialToken("<|im_start|>"),
        SpecialToken("<|im_end|>"),
        SpecialToken("<|unused|>"),  # not in the template
        SpecialToken("<tab>", control=False),  # user-defined: not a cut point
    ]
    assert turn_markers(specials, template) == ["<|im_start|>", "<|im_end|>"]
    # llama.cpp matches longer special tokens first: one that can cover the marker disqualifies it
    assert turn_markers([*specials, SpecialToken("\n<|im_start|>", control=False)], template) == ["<|im_end|>"]
    # a shorter one is matched after the marker was split out: harmless
    assert turn_markers([*specials, SpecialToken("|>", control=False)], template) == ["<|im_start|>", "<|im_end|>"]
    # a marker that strips whitespace on its left changes the piece before it
    assert turn_markers([SpecialToken("<|im_start|>", lstrip=True), specials[1]], template) == ["<|im_end|>"]


def test_pieces_join_back_and_only_new_pieces_are_tokenized() -> None:
    seen: list[str] = []

    def tokenize(text: str) -> list[int]:
        seen.append(text)
        return [ord(c) for c in text]

    tok = PromptTokenizer(tokenize, ["<e>", "<s>"], start=[1])
    turn1 = "<s>user\nhi<e>\n<s>model\n"
    assert tok.pieces(turn1) == ["<s>user\nhi", "<e>\n", "<s>model\n"]
    assert tok.tokens(turn1) == [1, *map(ord, turn1)]
    turn2 = turn1 + "hello<e>\n<s>user\nmore<e>\n<s>model\n"
    seen.clear()
    assert tok.tokens(turn2) == [1, *map(ord, turn2)]
    assert seen == ["<s>model\nhello", "<s>user\nmore"]  # the rest came from the cache
    assert "".join(tok.pieces("x<s>y<s>")) == "x<s>y<s>"
    assert tok.pieces("") == []


def test_the_cache_stays_within_its_token_budget() -> None:
    tok = PromptTokenizer(lambda t: [0] * len(t), ["|"], max_cached_tokens=10)
    for i in range(20):
        tok.tokens(f"|{i:04d}")
    assert tok._cached_tokens <= 10
    tok.tokens("|0019")
    assert tok.hits == 1
    tok.tokens("|0000")  # evicted long ago
    assert tok.hits == 1


# -- real llama.cpp -------------------------------------------------------------------------------
def _load(path: Path, info: GGUFInfo) -> LlamaModel:
    entry = ModelEntry(path.stem, path, "custom", path.stat().st_size, (path,), info)
    return LlamaModel(Runtime(), entry, LoadOptions(parallel=1, threads=1))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    from gguf_factory import write_tiny_gguf

    # a user-defined token that can cover `<|im_start|>`: cutting before that marker would be wrong
    path = write_tiny_gguf(tmp_path_factory.mktemp("pt") / "tiny.gguf", user_defined=["\n<|im_start|>u"])
    model = _load(path, read_gguf_info(path))
    assert model.template.name == "model"  # the file's ChatML template
    yield model
    model.close()


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path) -> Iterator[LlamaModel]:
    model = _load(gemma_gguf, read_gguf_info(gemma_gguf))
    yield model
    model.close()


CONTENT = st.lists(
    st.sampled_from(
        [
            "a",
            " ",
            "  ",
            "\n",
            "\n\n",
            "\t",
            "the",
            " world",
            "🙂",
            "日本",
            "é",
            "<",
            ">",
            "|",
            "_",
            "<|im_start|>",
            "<|im_end|>",
            "<|im_start",
            "im_end|>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_turn",
            "end_of_turn>",
            "<unused7>",
            "<b>",
            "</s>",
            "<s>",
            "u",
        ]
    ),
    max_size=40,
).map("".join)
CONVERSATION = st.lists(st.tuples(CONTENT, CONTENT), min_size=1, max_size=6)


def _render(model: LlamaModel, turns: list[tuple[str, str]]) -> str:
    messages = [m for u, a in turns for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})]
    return model.render(messages[:-1])


def _assert_pieces_equal_whole(model: LlamaModel, tok: PromptTokenizer) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(CONVERSATION)
    def check(turns: list[tuple[str, str]]) -> None:
        prompt = _render(model, turns)
        assert tok.tokens(prompt) == model.tokenize(prompt)

    check()


def test_tiny_vocabulary_pieces_equal_whole_prompts(tiny_model: LlamaModel) -> None:
    tok = tiny_model.prompt_tokenizer()
    assert tok.markers  # `<|im_end|>` is still a safe cut point
    _assert_pieces_equal_whole(tiny_model, tok)
    # the overlapping user-defined token really changes tokenization across the marker
    text = "<|im_end|>\n<|im_start|>user\nhi"
    naive = PromptTokenizer(
        lambda t: tiny_model.tokenize(t, add_special=False),
        ["<|im_start|>", "<|im_end|>"],
        start=tiny_model.tokenize("", add_special=True),
    )
    assert naive.tokens(text) != tiny_model.tokenize(text)
    assert tok.tokens(text) == tiny_model.tokenize(text)


@pytest.mark.gemma
def test_gemma_pieces_equal_whole_prompts_and_a_continued_conversation_hits_the_cache(gemma: LlamaModel) -> None:
    tok = gemma.prompt_tokenizer()
    assert tok.pieces("<start_of_turn>user\nhi<end_of_turn>\n") == ["<start_of_turn>user\nhi", "<end_of_turn>\n"]
    _assert_pieces_equal_whole(gemma, tok)
    turns = [(f"Question {i}: tell me more about the lighthouse. " * 8, f"Answer {i}. " * 30) for i in range(12)]
    first = _render(gemma, turns[:-1])
    assert gemma.tokenize_prompt(first) == gemma.tokenize(first)
    misses = tok.misses
    second = _render(gemma, turns)
    assert gemma.tokenize_prompt(second) == gemma.tokenize(second)
    assert tok.misses - misses <= 3  # the new answer, the new question, at most one more


def test_the_longest_piece_read_from_the_file_is_llama_cpp_s(tiny_model: LlamaModel) -> None:
    """The longest token text from the file's header (`token_text_lengths`) is what llama.cpp answers
    token by token; the generated vocabulary has byte tokens ("<0x0A>": six characters for one byte)."""
    assert tiny_model.longest_piece() == llama_longest_piece(tiny_model.vocab, tiny_model.n_vocab)


@pytest.mark.gemma
def test_gemma_s_longest_piece_read_from_the_file_is_llama_cpp_s(gemma: LlamaModel) -> None:
    """Gemma 3's 262,144 SentencePiece tokens ("▁" is three bytes of text, one of piece): the same figure."""
    assert gemma.longest_piece() == llama_longest_piece(gemma.vocab, gemma.n_vocab) == 49
    text = "▁" * 20 + " " * 10_000  # a text of spaces is at least its bytes over the longest piece in tokens
    assert len(gemma.tokenize(text)) >= -(-len(text.encode()) // gemma.longest_piece())


def test_the_piece_tokenizer_is_built_at_load_off_the_loading_thread(tmp_path: Path) -> None:
    """Built on its own thread while llama.cpp makes the context: no request waits for it or shares
    the CPU with it, and until it is ready prompts are tokenized whole."""
    from gguf_factory import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "fresh.gguf")
    model = _load(path, read_gguf_info(path))
    try:
        thread = model._prompt_tokenizer_thread
        assert thread is not None and thread is not threading.current_thread()
        turns = [(f"the local model {i} " * 12, "hello world " * 12) for i in range(12)]
        long = _render(model, turns)
        assert model.tokenize_prompt(long) == model.tokenize(long)  # whole, or in pieces if already built
        thread.join(60)
        tok = model._prompt_tokenizer
        assert tok is not None and tok.markers
        assert model.tokenize_prompt(long) == model.tokenize(long)
        misses = tok.misses
        assert model.tokenize_prompt(long) == model.tokenize(long)
        assert tok.misses == misses and tok.hits > 0  # the same prompt again: all pieces cached
    finally:
        model.close()
