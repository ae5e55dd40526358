"""The `llama_batch` a model's thread fills token by token and hands to llama.cpp.

Why a module: the generation scheduler (`scheduler`) and the embedding model's thread
(`embedder`) feed llama.cpp the same way: one batch allocated for the model's life
(`capacity` tokens, each in one sequence), filled position by position before every
decode, freed when the model closes. The ctypes field writes live here once (llama-cpp-python's
stubs type the pointer fields as arrays of arrays, so the batch is `Any` to the type checker), and so
does what llama.cpp makes of a batch's order (`micro_batches`) and shape (`even_drafts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import llama_cpp


class Batch:
    """A `llama_batch` of up to `capacity` tokens; only the thread that owns the context uses it."""

    def __init__(self, capacity: int) -> None:
        self.raw: Any = llama_cpp.llama_batch_init(capacity, 0, 1)

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        """Entry `i`: `token` at position `pos` of sequence `seq`; `logits`: llama.cpp computes its output."""
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq
        raw.logits[i] = logits

    def decode(self, ctx: Any, n: int) -> int:
        """`llama_decode` of entries 0..n-1; llama.cpp's result (0: done, 1: no room in the KV cache)."""
        self.raw.n_tokens = n
        return int(llama_cpp.llama_decode(ctx, self.raw))

    def encode(self, ctx: Any, n: int) -> int:
        """`llama_encode` of entries 0..n-1 (an encoder, which keeps no KV cache); llama.cpp's result."""
        self.raw.n_tokens = n
        return int(llama_cpp.llama_encode(ctx, self.raw))

    def free(self) -> None:
        """Give the memory back (once; later calls do nothing)."""
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


def micro_batches(seq_ids: Iterable[int]) -> int:
    """How many passes over the weights llama.cpp makes for one token of each of these sequences.

    With a KV stream per sequence (the scheduler's contexts are not unified), llama.cpp splits a batch
    into micro-batches of sequences whose ids follow one another in the batch (`split_equal`,
    sequential): sequences 0, 1, 2 decode in one pass, 0, 1, 3 in two. A pass reads all the weights,
    so on a model whose decode is bound by memory a gap costs every step about a step: the scheduler
    writes its batches in sequence order and admits a request where it leaves fewest gaps."""
    ids = sorted(set(seq_ids))
    return sum(1 for i, seq in enumerate(ids) if i == 0 or seq != ids[i - 1] + 1)


def even_drafts(drafts: Mapping[int, Sequence[int]]) -> dict[int, Sequence[int]]:
    """The drafts of the sequences that decode in one step, each cut to the shortest drafted.

    Why: with a KV stream per sequence, llama.cpp's `split_equal` takes the same number of tokens of
    every sequence into a micro-batch, and each micro-batch is a pass over the weights. Sequences that
    feed 1, 4, 9 and 17 tokens (their next token and a draft each) make four passes; cut to one length,
    a step makes at most two (sequences with no draft feed their one token in the first). Eight stories
    decoding at once (Gemma 3 270M, in process, 96 tokens each, drafts kept about half the time) took
    a step of up to six passes, and drafting gained 1.01x over not drafting; cut, 1.21-1.28x (four
    stories: 1.40x, cut 1.49-1.51x). What is cut is the longer drafts' tails: beside others a sequence copying a
    long passage drafts it over more steps; alone it drafts as long as before."""
    lengths = [len(draft) for draft in drafts.values() if draft]
    if len(set(lengths)) <= 1:
        return dict(drafts)
    shortest = min(lengths)
    return {seq: draft[:shortest] for seq, draft in drafts.items()}


def warm_up(ctx: Any, memory: Any, token: int) -> bool:
    """Decode two tokens in a new context, then forget them, as llama.cpp's own tools do at start.

    A context's first decode sets up what every later one reuses (the CPU backend's threads, which
    belong to the thread that decodes, and its work buffer). Done at load, on the thread that will
    decode, the first request does not pay for it: on Gemma 3 270M with two threads, the first
    request's time to first token (a 40-token prompt) was 92-126 ms without it and 85-87 ms with it,
    five loads each. True when llama.cpp decoded them."""
    batch = Batch(2)
    try:
        batch.put(0, token, 0, 0, False)
        batch.put(1, token, 1, 0, True)
        done = batch.decode(ctx, 2) == 0
        llama_cpp.llama_synchronize(ctx)
    finally:
        llama_cpp.llama_memory_clear(memory, True)
        batch.free()
    return done
