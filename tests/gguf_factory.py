"""Generate tiny but real GGUF models for tests and benchmarks.

The files are written with the `gguf` package (llama.cpp's own writer): a
`llama`-architecture network with random weights and an SPM vocabulary of
control tokens, the 256 byte tokens and a few dozen word pieces. llama.cpp
loads one in milliseconds and decodes (gibberish) from it, so every layer of
the service is exercised for real without a large download.

The output rows of control tokens (EOS included) are zero while the other
rows are large, so the model practically never ends on its own: tests get
exactly `max_output_tokens` tokens, or stop on a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONTROL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
]
# Tokens the chat-side features use as text markers (kept as normal tokens).
MARKER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
BIAS_ANCHOR = 8.0  # see write_tiny_gguf(logit_bias=...)
WORD_PIECES = [
    "▁the",
    "▁a",
    "▁is",
    "▁of",
    "▁and",
    "▁to",
    "▁in",
    "▁it",
    "▁that",
    "▁you",
    "▁hello",
    "▁world",
    "▁model",
    "▁local",
    "▁service",
    "▁token",
    "▁stream",
    "▁test",
    "▁user",
    "▁assistant",
    "▁system",
    "▁weather",
    "▁city",
    "▁name",
    "▁value",
    "▁",
    "▁▁",
    "\n",
    "{",
    "}",
    '"',
    ":",
    ",",
    "[",
    "]",
    "▁true",
    "▁false",
    "▁null",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    ".",
    "-",
    "e",
    "a",
    "b",
    "c",
    "ж",
    "€",
    "日本",
    "▁héllo",
    "🙂",
]


FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]  # Qwen2.5-Coder's / CodeGemma's names


def vocabulary(
    user_defined: Sequence[str] = (), control: Sequence[str] = ()
) -> tuple[list[str], list[float], list[int]]:
    """Token strings, scores and token types (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte);
    `control` adds control tokens at the end (the other tokens keep their ids)."""
    tokens: list[str] = []
    types: list[int] = []
    for tok in CONTROL_TOKENS:
        tokens.append(tok)
        types.append(2 if tok == "<unk>" else 3)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
    for tok in MARKER_TOKENS + WORD_PIECES:
        tokens.append(tok)
        types.append(1)
    for tok in user_defined:
        tokens.append(tok)
        types.append(4)
    for tok in control:
        tokens.append(tok)
        types.append(3)
    assert len(set(tokens)) == len(tokens), "llama.cpp aborts on duplicate token strings"
    scores = [0.0 if t != 1 else -float(i) / 100 for i, t in enumerate(types)]
    return tokens, scores, types


@dataclass(frozen=True)
class Vocabulary:
    """A real model's tokenizer, read from its GGUF, for a generated model that tokenizes as it does."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    kv: dict[str, object]  # the other tokenizer.ggml.* keys (special token ids, add_bos, pre-tokenizer...)


def vocabulary_of(path: str | Path) -> Vocabulary:
    """The tokenizer of the GGUF at `path` (e.g. Gemma's 262,144 tokens from the demo model)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = reader.fields
    tokens = [str(t) for t in fields["tokenizer.ggml.tokens"].contents()]
    scores = [float(s) for s in fields["tokenizer.ggml.scores"].contents()]
    types = [int(t) for t in fields["tokenizer.ggml.token_type"].contents()]
    skip = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.chat_template"}
    kv = {k: f.contents() for k, f in fields.items() if k.startswith("tokenizer.") and k not in skip}
    return Vocabulary(tokens, scores, types, kv)


def _add_values(writer: Any, values: dict[str, object]) -> None:
    """Header keys by their Python type (bool, int as uint32, float as float32, else a string)."""
    for key, value in values.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, str(value))


def write_tiny_gguf(
    path: str | Path,
    *,
    chat_template: str | None = CHATML_TEMPLATE,
    name: str = "Tiny Test",
    basename: str | None = "tiny-test",
    size_label: str | None = "1M",
    file_type: int | None = 0,  # ALL_F32
    context_length: int = 512,
    embedding: int = 64,
    blocks: int = 2,
    heads: int = 4,
    heads_kv: int = 4,
    ffn: int = 128,
    seed: int = 0,
    extra_kv: dict[str, object] | None = None,
    split_max_tensors: int = 0,
    logit_bias: dict[str, float] | None = None,
    output_scale: float = 2.0,
    user_defined: Sequence[str] = (),
    fim: str | None = None,
    vocab: Vocabulary | None = None,
) -> Path:
    """Write a tiny llama-architecture GGUF and return its path.

    With `split_max_tensors` > 0 the model is split llama.cpp-style into
    ``<stem>-00001-of-0000N.gguf`` ... beside `path`; the first part's path
    is returned.

    `logit_bias` maps token strings to a strength: those tokens get a steady positive logit
    offset (through an embedding dimension no layer writes to), so a test model can be made to
    close strings or thinking blocks often instead of wandering until the context is full.
    A smaller `output_scale` flattens the next-token distribution (more variety across seeds).
    `user_defined` adds tokens llama.cpp splits out of text before tokenizing (like HTML tags in Gemma).
    `fim` adds fill-in-the-middle control tokens: "metadata" also names them in
    `tokenizer.ggml.fim_{pre,suf,mid}_token_id`; "names" leaves llama.cpp to find them by their text.
    `vocab` replaces the made-up vocabulary with a real model's (`vocabulary_of`), so a prompt takes as
    many tokens as it would on that model.
    """
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if vocab is not None:
        tokens, scores, types = vocab.tokens, vocab.scores, vocab.types
    else:
        tokens, scores, types = vocabulary(user_defined, FIM_TOKENS if fim else ())
    n_vocab = len(tokens)
    head_dim = embedding // heads
    kv_dim = head_dim * heads_kv

    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    writer.add_name(name)
    if basename:
        writer.add_basename(basename)
    if size_label:
        writer.add_size_label(size_label)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_context_length(context_length)
    writer.add_embedding_length(embedding)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    if vocab is not None:
        _add_values(writer, vocab.kv)
    else:
        writer.add_tokenizer_model("llama")
        writer.add_bos_token_id(tokens.index("<s>"))
        writer.add_eos_token_id(tokens.index("</s>"))
        writer.add_unk_token_id(tokens.index("<unk>"))
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
    if fim == "metadata":
        for key, tok in zip(("pre", "suf", "mid"), FIM_TOKENS, strict=True):
            writer.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", tokens.index(tok))
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    _add_values(writer, extra_kv or {})

    def weight(*shape: int, scale: float = 0.5) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    embd = weight(n_vocab, embedding)
    output = weight(n_vocab, embedding, scale=output_scale)
    output[[i for i, t in enumerate(types) if t in (2, 3)]] = 0.0  # never end on its own
    if logit_bias:
        # Dimension 0 of the residual stream is a constant: every embedding holds BIAS_ANCHOR
        # there and no block writes to it (row 0 of attn_output/ffn_down is zero below).
        embd[:, 0] = BIAS_ANCHOR
        output[:, 0] = 0.0
        for tok, strength in logit_bias.items():
            output[tokens.index(tok), 0] = strength
    writer.add_tensor("token_embd.weight", embd)
    writer.add_tensor("output_norm.weight", np.ones(embedding, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    for b in range(blocks):
        writer.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(embedding, dtype=np.float32))
        writer.add_tensor(f"blk.{b}.attn_q.weight", weight(embedding, embedding))
        writer.add_tensor(f"blk.{b}.attn_k.weight", weight(kv_dim, embedding))
        writer.add_tensor(f"blk.{b}.attn_v.weight", weight(kv_dim, embedding))
        attn_out = weight(embedding, embedding)
        if logit_bias:
            attn_out[0] = 0.0
        writer.add_tensor(f"blk.{b}.attn_output.weight", attn_out)
        writer.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(embedding, dtype=np.float32))
        writer.add_tensor(f"blk.{b}.ffn_gate.weight", weight(ffn, embedding))
        writer.add_tensor(f"blk.{b}.ffn_up.weight", weight(ffn, embedding))
        ffn_down = weight(embedding, ffn)
        if logit_bias:
            ffn_down[0] = 0.0
        writer.add_tensor(f"blk.{b}.ffn_down.weight", ffn_down)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)[0]


# -- a tiny BERT embedding model -------------------------------------------------------------------

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_WORDS = [
    "the", "a", "is", "of", "and", "to", "in", "it", "that", "you", "hello", "world", "model", "local",
    "service", "token", "stream", "test", "user", "cat", "dog", "sat", "on", "mat", "embedding", "vector",
    "search", "apple", "banana", "red", "green", "blue", "sky", "sea", "fast", "slow", "text", "number",
    "play", "ing", "ed", "s", "er", ".", ",", "?", "!", "'",
]  # fmt: skip


def bert_vocabulary() -> tuple[list[str], list[int]]:
    """WordPiece tokens as llama.cpp stores them (a word's first piece with a leading '▁', continuations
    bare) and their types (3 control, 1 normal); every letter and digit both ways, so any ASCII word
    tokenizes without [UNK]."""
    tokens = list(BERT_SPECIALS)
    types = [3] * len(tokens)
    pieces = [*BERT_WORDS, *"abcdefghijklmnopqrstuvwxyz0123456789"]
    for piece in dict.fromkeys(pieces):
        for tok in (f"▁{piece}", piece):
            if tok not in tokens:
                tokens.append(tok)
                types.append(1)
    return tokens, types


def write_tiny_bert_gguf(
    path: str | Path,
    *,
    name: str = "Tiny Embed",
    basename: str | None = "tiny-embed",
    context_length: int = 128,
    embedding: int = 64,
    blocks: int = 2,
    heads: int = 4,
    ffn: int = 128,
    pooling_type: int | None = 1,  # MEAN; None leaves the key out (llama.cpp then pools nothing)
    seed: int = 0,
    classifier: bool = False,  # a `cls` / `cls.output` head (a reranker: with pooling_type 4)
) -> Path:
    """Write a tiny BERT-architecture (encoder-only) embedding GGUF and return its path."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, types = bert_vocabulary()
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_name(name)
    if basename:
        writer.add_basename(basename)
    writer.add_size_label("1M")
    writer.add_file_type(0)
    writer.add_context_length(context_length)
    writer.add_embedding_length(embedding)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    if pooling_type is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling_type))
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(2)
    writer.add_bos_token_id(tokens.index("[CLS]"))
    writer.add_sep_token_id(tokens.index("[SEP]"))
    writer.add_unk_token_id(tokens.index("[UNK]"))
    writer.add_pad_token_id(tokens.index("[PAD]"))
    writer.add_mask_token_id(tokens.index("[MASK]"))
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, embedding, scale=1.0))
    writer.add_tensor("token_types.weight", weight(2, embedding))
    writer.add_tensor("position_embd.weight", weight(context_length, embedding))
    writer.add_tensor("token_embd_norm.weight", ones(embedding))
    writer.add_tensor("token_embd_norm.bias", weight(embedding, scale=0.02))
    for b in range(blocks):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{b}.{part}.weight", weight(embedding, embedding))
            writer.add_tensor(f"blk.{b}.{part}.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"blk.{b}.attn_output_norm.weight", ones(embedding))
        writer.add_tensor(f"blk.{b}.attn_output_norm.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"blk.{b}.ffn_up.weight", weight(ffn, embedding))
        writer.add_tensor(f"blk.{b}.ffn_up.bias", weight(ffn, scale=0.02))
        writer.add_tensor(f"blk.{b}.ffn_down.weight", weight(embedding, ffn))
        writer.add_tensor(f"blk.{b}.ffn_down.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"blk.{b}.layer_output_norm.weight", ones(embedding))
        writer.add_tensor(f"blk.{b}.layer_output_norm.bias", weight(embedding, scale=0.02))
    if classifier:  # RoBERTa's head: dense + tanh, then one relevance logit
        writer.add_tensor("cls.weight", weight(embedding, embedding))
        writer.add_tensor("cls.bias", weight(embedding, scale=0.02))
        writer.add_tensor("cls.output.weight", weight(1, embedding, scale=1.0))
        writer.add_tensor("cls.output.bias", weight(1, scale=0.02))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_reranker_gguf(
    path: str | Path, *, name: str = "Tiny Rerank", basename: str = "tiny-rerank", seed: int = 1, **shape: Any
) -> Path:
    """A tiny BERT-shaped reranker (as bge-reranker is): rank pooling (`bert.pooling_type = 4`) and a
    classifier head; llama-server `--reranking` serves it."""
    return write_tiny_bert_gguf(path, name=name, basename=basename, pooling_type=4, seed=seed, classifier=True, **shape)


# -- a tiny vision projector (mmproj) ---------------------------------------------------------------


def write_tiny_mmproj_gguf(
    path: str | Path,
    *,
    text_embedding: int = 64,
    name: str = "Tiny Vision",
    image_size: int = 224,
    patch_size: int = 8,
    embedding: int = 32,
    blocks: int = 3,
    heads: int = 2,
    ffn: int = 64,
    projector_hidden: int = 64,
    seed: int = 0,
) -> Path:
    """Write a tiny CLIP projector GGUF in llama.cpp's layout (`clip.projector_type = "mlp"`, LLaVA's
    two-layer projector: no image marker tokens, no tiling) and return its path.

    A `image_size` px image in `patch_size` patches gives (image_size / patch_size)^2 image tokens of
    width `text_embedding`, which must be the text model's embedding width. The vision blocks' matrices
    are F16 (as real projectors); libmtmd and `llama-server --mmproj` load it and encode for real.
    """
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_patches = (image_size // patch_size) ** 2

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name(name)
    writer.add_file_type(1)  # MOSTLY_F16
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", embedding)
    writer.add_uint32("clip.vision.feed_forward_length", ffn)
    writer.add_uint32("clip.vision.block_count", blocks)
    writer.add_uint32("clip.vision.projection_dim", text_embedding)
    writer.add_uint32("clip.vision.attention.head_count", heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def weight(*shape: int, scale: float = 0.2, f16: bool = False) -> np.ndarray:
        w = (rng.standard_normal(shape) * scale).astype(np.float32)
        return w.astype(np.float16) if f16 else w

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("v.patch_embd.weight", weight(embedding, 3, patch_size, patch_size, f16=True))
    writer.add_tensor("v.patch_embd.bias", weight(embedding, scale=0.02))
    writer.add_tensor("v.position_embd.weight", weight(n_patches, embedding, scale=0.1))
    writer.add_tensor("v.pre_ln.weight", ones(embedding))
    writer.add_tensor("v.pre_ln.bias", weight(embedding, scale=0.02))
    for b in range(blocks):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{b}.{part}.weight", weight(embedding, embedding, f16=True))
            writer.add_tensor(f"v.blk.{b}.{part}.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"v.blk.{b}.ln1.weight", ones(embedding))
        writer.add_tensor(f"v.blk.{b}.ln1.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"v.blk.{b}.ln2.weight", ones(embedding))
        writer.add_tensor(f"v.blk.{b}.ln2.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"v.blk.{b}.ffn_up.weight", weight(ffn, embedding, f16=True))
        writer.add_tensor(f"v.blk.{b}.ffn_up.bias", weight(ffn, scale=0.02))
        writer.add_tensor(f"v.blk.{b}.ffn_down.weight", weight(embedding, ffn, f16=True))
        writer.add_tensor(f"v.blk.{b}.ffn_down.bias", weight(embedding, scale=0.02))
    writer.add_tensor("mm.0.weight", weight(projector_hidden, embedding, scale=0.5, f16=True))
    writer.add_tensor("mm.0.bias", weight(projector_hidden, scale=0.02))
    writer.add_tensor("mm.2.weight", weight(text_embedding, projector_hidden, scale=0.5, f16=True))
    writer.add_tensor("mm.2.bias", weight(text_embedding, scale=0.02))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_vision_pair(folder: str | Path, *, name: str = "tiny-vision", seed: int = 0) -> tuple[Path, Path]:
    """A tiny llama-architecture text model `<name>.gguf` and its projector `mmproj-<name>.gguf` side
    by side in `folder` (as a Hugging Face repository holds them); the text model's context holds a
    784-token image and a conversation around it."""
    folder = Path(folder)
    model = write_tiny_gguf(folder / f"{name}.gguf", name="Tiny Vision", basename=name, context_length=4096, seed=seed)
    projector = write_tiny_mmproj_gguf(folder / f"mmproj-{name}.gguf", text_embedding=64, seed=seed + 1)
    return model, projector


# -- a tiny audio projector (mmproj with a Whisper-style encoder) ----------------------------------


def write_tiny_audio_mmproj_gguf(
    path: str | Path,
    *,
    text_embedding: int = 64,
    name: str = "Tiny Audio",
    mel_bins: int = 80,
    embedding: int = 32,
    blocks: int = 2,
    heads: int = 2,
    ffn: int = 64,
    stack_factor: int = 10,
    projector_hidden: int = 64,
    seed: int = 0,
) -> Path:
    """Write a tiny audio projector GGUF in llama.cpp's layout (`clip.projector_type = "ultravox"`: a
    Whisper encoder, two 1-D convolutions then transformer blocks, and Ultravox's stacked-frames SwiGLU
    projector; no marker tokens around the audio) and return its path.

    libmtmd computes the log-mel spectrogram itself (16 kHz, 30 s windows of 3000 frames): each started
    30 s of audio gives 3000 / 2 / `stack_factor` (150) tokens of width `text_embedding`, which must be
    the text model's embedding width. `stack_factor` must divide 1500 (libmtmd counts the tokens as
    3000 / stack / 2 but its graph stacks 1500 rows rounded up: Ultravox's own 8 gives 188 for 187 and
    aborts). libmtmd and `llama-server --mmproj` load it and encode for real.
    """
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    positions = 1500  # Whisper's: 3000 mel frames, halved by the second convolution

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name(name)
    writer.add_file_type(1)  # MOSTLY_F16
    writer.add_string("clip.projector_type", "ultravox")
    writer.add_bool("clip.has_vision_encoder", False)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_uint32("clip.audio.num_mel_bins", mel_bins)
    writer.add_uint32("clip.audio.embedding_length", embedding)
    writer.add_uint32("clip.audio.feed_forward_length", ffn)
    writer.add_uint32("clip.audio.block_count", blocks)
    writer.add_uint32("clip.audio.projection_dim", text_embedding)
    writer.add_uint32("clip.audio.attention.head_count", heads)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.audio.projector.stack_factor", stack_factor)

    def weight(*shape: int, scale: float = 0.2, f16: bool = False) -> np.ndarray:
        w = (rng.standard_normal(shape) * scale).astype(np.float32)
        return w.astype(np.float16) if f16 else w

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("a.conv1d.1.weight", weight(embedding, mel_bins, 3, f16=True))
    writer.add_tensor("a.conv1d.1.bias", weight(embedding, 1, scale=0.02))
    writer.add_tensor("a.conv1d.2.weight", weight(embedding, embedding, 3, f16=True))
    writer.add_tensor("a.conv1d.2.bias", weight(embedding, 1, scale=0.02))
    writer.add_tensor("a.position_embd.weight", weight(positions, embedding, scale=0.1))
    for b in range(blocks):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"a.blk.{b}.{part}.weight", weight(embedding, embedding, f16=True))
            if part != "attn_k":  # Whisper's key projection has no bias
                writer.add_tensor(f"a.blk.{b}.{part}.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"a.blk.{b}.ln1.weight", ones(embedding))
        writer.add_tensor(f"a.blk.{b}.ln1.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"a.blk.{b}.ln2.weight", ones(embedding))
        writer.add_tensor(f"a.blk.{b}.ln2.bias", weight(embedding, scale=0.02))
        writer.add_tensor(f"a.blk.{b}.ffn_up.weight", weight(ffn, embedding, f16=True))
        writer.add_tensor(f"a.blk.{b}.ffn_up.bias", weight(ffn, scale=0.02))
        writer.add_tensor(f"a.blk.{b}.ffn_down.weight", weight(embedding, ffn, f16=True))
        writer.add_tensor(f"a.blk.{b}.ffn_down.bias", weight(embedding, scale=0.02))
    writer.add_tensor("a.post_ln.weight", ones(embedding))
    writer.add_tensor("a.post_ln.bias", weight(embedding, scale=0.02))
    stacked = embedding * stack_factor
    writer.add_tensor("mm.a.norm_pre.weight", ones(stacked))
    writer.add_tensor("mm.a.mlp.1.weight", weight(2 * projector_hidden, stacked, scale=0.3, f16=True))
    writer.add_tensor("mm.a.norm_mid.weight", ones(projector_hidden))
    writer.add_tensor("mm.a.mlp.2.weight", weight(text_embedding, projector_hidden, scale=0.5, f16=True))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_audio_pair(folder: str | Path, *, name: str = "tiny-audio", seed: int = 0) -> tuple[Path, Path]:
    """A tiny llama-architecture text model `<name>.gguf` and its audio projector `mmproj-<name>.gguf`
    side by side in `folder`; the text model's context holds a few 30 s windows of audio (150 tokens
    each) and a conversation around them."""
    folder = Path(folder)
    model = write_tiny_gguf(folder / f"{name}.gguf", name="Tiny Audio", basename=name, context_length=4096, seed=seed)
    projector = write_tiny_audio_mmproj_gguf(folder / f"mmproj-{name}.gguf", text_embedding=64, seed=seed + 1)
    return model, projector


def tone_wav(seconds: float = 1.0, *, hertz: float = 440.0, rate: int = 16000, channels: int = 1) -> bytes:
    """A WAV file (16-bit PCM, `rate` Hz) holding `seconds` of a sine tone at `hertz`: test audio."""
    import io
    import wave

    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * hertz * t) * 0.3 * 32767).astype("<i2")
    if channels > 1:
        samples = np.repeat(samples, channels)
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.tobytes())
    return out.getvalue()
