"""A draft model: a small model with the same vocabulary that proposes tokens where prompt lookup has none.

Prompt lookup (`speculation.PromptLookup`) drafts only what repeats; free-form text repeats little.
A small model of the same family (the same tokenizer, so its token ids mean the same) guesses the
next few tokens of such text cheaply, and the scheduler verifies its guesses exactly as it verifies
prompt-lookup drafts: in the same batch as every other sequence's step, each position sampled with
the sequence's own sampler, a draft token kept only while it equals what was sampled there. So the
output is what it would be without the draft (greedy: the same tokens; sampling: the same
distribution and, seeded, the same text), only sooner when the guesses are right.

The draft model lives in the model process beside the main model, on the same thread: its own small
context holds one sequence per main sequence slot (same window), and each sequence's KV follows the
main sequence lazily: before drafting, the tokens the draft holds are cut back to what they share
with the main sequence (`llama_memory_seq_rm`: rejected guesses go), and what is missing is decoded
(a new prompt's tokens, the tokens accepted since). Drafting is greedy and stops early where the
draft model is unsure of its own guess (top probability below `P_MIN`, as llama-server's `--draft-p-min`).

Whether it pays is measured, not assumed (`Payoff`): a guess kept saves the model a decode step, and
guessing costs the draft model's decodes. Where the steps the kept guesses saved took less time than the
guessing, the draft model rests (no guesses for a while, longer each time it still does not pay): a draft
about as slow as the model, or one that guesses badly, then costs little.

A draft whose vocabulary differs from the main model's (token count, or the text of any of a spread
of sampled tokens) is refused (`DraftRefused`): the main model then loads and runs without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np

from lmsp_tray.runner.batch import Batch, warm_up
from lmsp_tray.runner.handles import free_handles
from lmsp_tray.runner.prompt_cache import common_prefix

log = logging.getLogger("lmsp_tray.runner")

P_MIN = 0.75  # stop a draft where the draft model's own top probability falls below this (llama-server's)
MAX_MODEL_DRAFT = 8  # the longest draft asked of the draft model in one step (each token costs a draft decode)
VOCAB_SAMPLES = 64  # token ids spread over the vocabulary whose texts must match
JUDGE_TOKENS = 48  # guessed tokens between two judgements of whether guessing pays
JUDGE_TRIES = 16  # or steps that consulted the draft model (an unsure draft guesses nothing, yet decodes)
FIRST_REST = 32  # steps without guessing after the first judgement that it does not pay; doubles each time
MAX_REST = 2048


class DraftRefused(Exception):
    """The draft model cannot serve this main model (missing, unloadable, another vocabulary)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class DraftWant:
    """One sequence's request for a draft: its tokens so far (the last not yet decoded), and how many."""

    seq_id: int
    held: Sequence[int]  # tokens whose KV the main sequence holds
    last: int  # the sampled token that follows them
    limit: int


def token_texts(vocab: llama_cpp.llama_vocab_p, ids: Sequence[int]) -> list[bytes]:
    return [llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in ids]


def vocab_samples(n_vocab: int, vocab: llama_cpp.llama_vocab_p) -> list[int]:
    """The ids compared between two vocabularies: a spread over all of them, and the special ones."""
    step = max(1, n_vocab // VOCAB_SAMPLES)
    specials = (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab))
    return sorted({*range(0, n_vocab, step), n_vocab - 1, *(s for s in specials if 0 <= s < n_vocab)})


@dataclass
class Payoff:
    """Whether the draft model's guesses save more decode time than they cost, judged every
    `JUDGE_TOKENS` guessed tokens or `JUDGE_TRIES` steps that consulted it (a step where it was unsure
    costs its decode and guesses nothing); when they do not, the draft model rests."""

    saved: float = 0.0  # seconds of the model's decode steps the kept guesses saved, since the last judgement
    spent: float = 0.0  # seconds the draft model took, since the last judgement
    guessed: int = 0
    tries: int = 0
    rest: int = 0  # steps left without guessing
    next_rest: int = FIRST_REST
    rests: list[int] = field(default_factory=list)  # the rests taken, for tests and the log

    def allowed(self) -> bool:
        """Whether to guess at this step (called once per step that would)."""
        if self.guessed >= JUDGE_TOKENS or self.tries >= JUDGE_TRIES:
            self.judge()  # the last guesses' verification is in by now
        if self.rest > 0:
            self.rest -= 1
            return False
        return True

    def spend(self, seconds: float, guessed: int) -> None:
        self.spent += seconds
        self.guessed += guessed
        self.tries += 1

    def keep(self, kept: int, step_seconds: float) -> None:
        """`kept` guessed tokens were kept: the model did not decode a step for each."""
        self.saved += kept * step_seconds

    def judge(self) -> None:
        if self.saved < self.spent:
            self.rest = self.next_rest
            self.rests.append(self.rest)
            self.next_rest = min(MAX_REST, self.next_rest * 2)
        else:
            self.next_rest = FIRST_REST
        self.saved = self.spent = 0.0
        self.guessed = self.tries = 0


class DraftModel:
    """The draft model's llama.cpp model and context; used only by the scheduler's thread."""

    def __init__(
        self,
        path: Path,
        main_vocab: llama_cpp.llama_vocab_p,
        *,
        parallel: int,
        context_per_sequence: int,
        batch_size: int,
        threads: int,
        gpu_layers: int,
        use_extra_bufts: bool,
        p_min: float = P_MIN,
    ) -> None:
        self.path = path
        self.p_min = p_min
        self.payoff: Payoff | None = Payoff()  # None: guess whatever it costs (tests)
        self._model = None
        self._ctx = None
        self._batch: Batch | None = None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        mparams.use_extra_bufts = use_extra_bufts
        model = llama_cpp.llama_model_load_from_file(os.fsencode(path), mparams)
        if not model:
            raise DraftRefused(f"llama.cpp could not load the draft {path.name}")
        self._model = model
        try:
            self.vocab = llama_cpp.llama_model_get_vocab(model)
            self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
            self.n_swa = max(0, llama_cpp.llama_model_n_swa(model))
            main_n = llama_cpp.llama_vocab_n_tokens(main_vocab)
            if self.n_vocab != main_n:
                raise DraftRefused(f"its vocabulary has {self.n_vocab:,} tokens, the model's {main_n:,}")
            ids = vocab_samples(main_n, main_vocab)
            differ = next(
                (
                    (i, a, b)
                    for i, a, b in zip(ids, token_texts(main_vocab, ids), token_texts(self.vocab, ids), strict=True)
                    if a != b
                ),
                None,
            )
            if differ is not None:
                i, a, b = differ
                raise DraftRefused(f"its token {i} is {b!r}, the model's is {a!r}: another vocabulary")
            if llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model):
                raise DraftRefused("it is a recurrent model, whose state cannot take back rejected guesses")
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = context_per_sequence * parallel
            cparams.n_seq_max = parallel
            cparams.n_batch = cparams.n_ubatch = max(batch_size, parallel)
            cparams.n_threads = cparams.n_threads_batch = threads
            cparams.kv_unified = False
            cparams.swa_full = False
            cparams.no_perf = True
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise DraftRefused(f"llama.cpp could not create the draft's context of {cparams.n_ctx} tokens")
        except BaseException:
            self.close()
            raise
        self._ctx = ctx
        self.memory = llama_cpp.llama_get_memory(ctx)
        self._capacity = int(cparams.n_batch)
        self._batch = Batch(self._capacity)
        self._caches: list[list[int]] = [[] for _ in range(parallel)]  # tokens whose KV each sequence holds
        self.decodes = 0  # draft-model decodes (observable)
        self.failed = 0  # decodes llama.cpp refused (its sequences then started over)

    def warm_up(self) -> None:
        """On the thread that will draft (llama.cpp's CPU threads belong to the one decoding)."""
        assert self._ctx is not None
        warm_up(self._ctx, self.memory, max(llama_cpp.llama_vocab_bos(self.vocab), 0))

    def propose(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        """Each sequence's greedy guess of its next `limit` tokens after `last` (fewer where the draft
        is unsure; none for a sequence whose missing tokens did not all fit in this step's catch-up)."""
        ctx, batch = self._ctx, self._batch
        if ctx is None or batch is None or not wants:
            return {}
        budget = self._capacity
        n = 0
        going: list[tuple[DraftWant, int]] = []  # sequences drafting, with their output's batch index
        for want in wants:
            cache = self._caches[want.seq_id]
            keep = common_prefix(cache, want.held)
            if self.n_swa and len(cache) - keep > MAX_MODEL_DRAFT + 1:
                keep = 0  # sliding-window layers keep only their window: further back, start over
            if keep < len(cache):
                llama_cpp.llama_memory_seq_rm(self.memory, want.seq_id, keep, -1)
                del cache[keep:]
            missing = [*want.held[keep:], want.last]
            take = missing[: max(0, budget - n)]
            if not take:
                continue
            pos = len(cache)
            for j, token in enumerate(take):
                batch.put(n, token, pos + j, want.seq_id, j == len(missing) - 1)
                n += 1
            cache.extend(take)
            if len(take) == len(missing):
                going.append((want, n - 1))
        drafts: dict[int, list[int]] = {want.seq_id: [] for want, _ in going}
        while n:
            if not self._decode(n, [w.seq_id for w in wants]):
                return {}
            n, still = 0, []
            for want, index in going:
                guess = self._guess(index)
                draft = drafts[want.seq_id]
                if guess is None:
                    continue
                draft.append(guess)
                if len(draft) >= want.limit:
                    continue
                cache = self._caches[want.seq_id]
                batch.put(n, guess, len(cache), want.seq_id, True)
                cache.append(guess)
                still.append((want, n))
                n += 1
            going = still
        return {seq: draft for seq, draft in drafts.items() if draft}

    def _guess(self, index: int) -> int | None:
        """The draft model's top token at output `index`, or None when it is unsure of it."""
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, index), shape=(self.n_vocab,))
        best = int(logits.argmax())
        if self.p_min > 0:
            peak = logits[best]
            if 1.0 / float(np.exp(logits - peak, dtype=np.float32).sum()) < self.p_min:
                return None
        if llama_cpp.llama_vocab_is_eog(self.vocab, best):
            return None
        return best

    def _decode(self, n: int, seqs: Sequence[int]) -> bool:
        assert self._batch is not None
        self.decodes += 1
        if self._batch.decode(self._ctx, n) == 0:
            return True
        self.failed += 1
        log.warning("the draft model could not decode a batch of %d tokens; its sequences start over", n)
        for seq in seqs:
            llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)
            self._caches[seq].clear()
        return False

    def close(self) -> None:
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        free_handles(self._ctx, self._model)
        self._ctx = self._model = None
