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
    """The drafts of the sequences that decode in one step (every one of them, by sequence id, a draft
    or none), cut to one length; drafts shorter than it wait for a later step.

    Why: with a KV stream per sequence, llama.cpp's `split_equal` takes the same number of tokens of
    every sequence into a micro-batch, and each micro-batch is a pass over the weights. Sequences that
    feed 1, 4, 9 and 17 tokens (their next token and a draft each) make four passes; with one length,
    one pass where all draft, two where some do not (more where the drafters' ids are not consecutive:
    `micro_batches`). The length is the one that feeds the most tokens a pass: usually the shortest
    draft, so that every sequence drafts in one pass, but a sequence copying a passage (a 62-token
    draft) beside one drafting 2 tokens copies on (64 tokens in two passes against 6 in one). A step
    costs about 20 ms a pass plus 4.5-6 ms a token (Gemma 3 270M, two CPU threads), but whatever a
    pass costs in tokens, the cheapest token fed (the step's cost over the tokens it feeds) is where
    most tokens share a pass, so the rule needs no price measured on this machine. Eight stories
    decoding at once (Gemma 3 270M, in process, 96 tokens each, drafts kept about half the time) took
    steps of up to six passes, and drafting gained 1.01x over not drafting; cut to the shortest
    draft, 1.21-1.28x; as here, 1.23x (four stories: 1.40x; 1.49-1.51x; 1.47x)."""
    lengths = sorted({len(draft) for draft in drafts.values() if draft})
    if len(lengths) <= 1:
        return dict(drafts)
    everyone = micro_batches(drafts)

    def worth(length: int) -> float:
        drafting = [seq for seq, draft in drafts.items() if len(draft) >= length]
        fed = len(drafts) + length * len(drafting)
        passes = everyone + (micro_batches(drafting) if len(drafting) < len(drafts) else 0)
        return fed / passes

    best = max(lengths, key=worth)  # of equals, the shorter
    return {seq: draft[:best] if len(draft) >= best else () for seq, draft in drafts.items()}


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
