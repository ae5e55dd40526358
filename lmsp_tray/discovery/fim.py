"""Whether a GGUF model has fill-in-the-middle tokens, decided from its header the way llama.cpp decides.

Why: the model listings say which models can fill in the middle (`POST /v1/completions`
with a `suffix`) so an editor can pick a code model, and listings never load models.
llama.cpp (`llama_vocab::impl::load`) takes the FIM prefix, suffix and middle token ids
from `tokenizer.ggml.fim_{pre,suf,mid}_token_id` — or the deprecated
`tokenizer.ggml.{prefix,suffix,middle}_token_id` — when they name a token of the
vocabulary, and otherwise looks for a token whose text is one it knows (`FIM_TEXTS`).
A model has FIM when all three are found; the engine refuses a `suffix` otherwise.

The texts are searched for in the raw bytes of `tokenizer.ggml.tokens`, where each
string is its 8-byte length followed by its bytes: one `bytes.find` per text, and a hit
counts only when it starts a string (walked to from the nearest checkpoint the header
reader noted), so the answer is exact, not a guess. Models whose metadata names the
tokens (most converted code models) need no search at all.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

FIM_KEYS: Mapping[str, tuple[str, ...]] = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
}
# llama.cpp's list (Qwen, StarCoder-style, Granite, DeepSeek, CodeLlama, GLM-4.5, Falcon-H1-Tiny-Coder).
FIM_TEXTS: Mapping[str, tuple[str, ...]] = {
    "prefix": (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
        "<|prefix|>",
    ),
    "suffix": (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
        "<|suffix|>",
    ),
    "middle": (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
        "<|middle|>",
    ),
}  # fmt: skip
_LENGTH = struct.Struct("<Q")


def _in_vocab(value: Any, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size


def _starts_a_string(vocab: bytes, at: int, checkpoints: Sequence[int]) -> bool:
    """Whether offset `at` of `vocab` is where a token string starts (not bytes inside another)."""
    i = bisect.bisect_right(checkpoints, at) - 1
    if i < 0:
        return False
    pos = checkpoints[i]
    while pos < at:
        pos += _LENGTH.size + _LENGTH.unpack_from(vocab, pos)[0]
    return pos == at


def _has_token(vocab: bytes, text: str, checkpoints: Sequence[int]) -> bool:
    raw = text.encode("utf-8")
    needle = _LENGTH.pack(len(raw)) + raw
    at = vocab.find(needle)
    while at >= 0:
        if _starts_a_string(vocab, at, checkpoints):
            return True
        at = vocab.find(needle, at + 1)
    return False


def has_fim_tokens(
    kv: Mapping[str, Any], vocab_size: int, read_vocab: Callable[[], bytes | None], checkpoints: Sequence[int]
) -> bool:
    """True when llama.cpp will find FIM prefix, suffix and middle tokens in this model.

    `kv`: the header's scalars; `vocab_size`: entries in `tokenizer.ggml.tokens`; `read_vocab`:
    the raw bytes of its strings (called only when the metadata does not name all three tokens;
    None when they cannot be read); `checkpoints`: offsets in those bytes where every n-th string
    starts, the first at 0."""
    if vocab_size <= 0:
        return False
    missing = [role for role, keys in FIM_KEYS.items() if not any(_in_vocab(kv.get(k), vocab_size) for k in keys)]
    if not missing:
        return True
    vocab = read_vocab()
    if vocab is None or not checkpoints:
        return False
    return all(any(_has_token(vocab, text, checkpoints) for text in FIM_TEXTS[role]) for role in missing)
