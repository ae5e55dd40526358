"""Per-request sampling: the llama.cpp sampler chain built from a request's `SamplingParams`.

Each request gets its own sampler chain (its own seed, penalties history and
grammar state), so requests decoded together in one batch never influence
each other's sampling.

A grammar is not part of the chain: checking every candidate against it costs
a lot on large vocabularies (Gemma's has 262k tokens). As llama.cpp's own
tools do, the token is sampled freely first and only checked against the
grammar; only when the grammar rejects it is it sampled again among what the
grammar allows. That second pass first looks at the most likely tokens only
(the top 256, then 4096, by logit): when enough of them are allowed — one
for greedy decoding, `top_k` for sampling, whose later steps only ever see
the `top_k` best — the pick is the one the whole vocabulary would give, and
the grammar checked a few hundred tokens instead of 262k. Otherwise, and
with penalties (which reorder logits), the grammar is applied to the whole
distribution. The result is always the token the grammar-first chain would
pick.

Plain greedy decoding (temperature 0, no penalties, no grammar) skips the chain
altogether: llama.cpp's sampler copies the whole vocabulary into a candidate
array for every token (0.6 ms on Gemma's, about 3% of a decode step on two
cores), where an argmax over the logits takes 0.04 ms and picks the same token
(the first of equal maxima, as llama.cpp's greedy sampler does).
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np

from lmsp_tray.engine.sampling import SamplingParams


class GrammarError(ValueError):
    """llama.cpp could not parse a grammar."""


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
SHORTLISTS = (256, 4096)  # how many of the most likely tokens a grammar re-sample looks at first
assert ctypes.sizeof(llama_cpp.llama_token_data) == _TOKEN_DATA.itemsize


class Sampler:
    """An owned llama.cpp sampler chain; `sample()` picks and accepts the next token."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p, params: SamplingParams) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        self._grammar: llama_cpp.llama_sampler_p | None = None
        self._argmax = params.greedy and not params.penalized and not params.grammar
        # Allowed tokens a shortlist must hold for its pick to be exact (None: always the whole vocabulary).
        self._enough: int | None = None
        if not params.penalized:
            self._enough = 1 if params.greedy else (params.top_k if params.top_k > 0 else None)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        # Buffers for grammar sampling (the whole vocabulary as llama_token_data cells).
        self._cells: ctypes.Array[llama_cpp.llama_token_data] | None = None
        self._view: np.ndarray = np.empty(0, dtype=_TOKEN_DATA)
        self._ids: np.ndarray = np.empty(0, dtype=np.int32)
        self._one: ctypes.Array[llama_cpp.llama_token_data] | None = None
        try:
            self._build(vocab, params)
            if self._grammar is not None:
                self._cells = (llama_cpp.llama_token_data * self._n_vocab)()
                self._view = np.frombuffer(self._cells, dtype=_TOKEN_DATA)
                self._ids = np.arange(self._n_vocab, dtype=np.int32)
                self._one = (llama_cpp.llama_token_data * 1)()
        except Exception:
            self.close()
            raise

    def _add(self, sampler: llama_cpp.llama_sampler_p | None) -> None:
        if not sampler:
            raise GrammarError("llama.cpp rejected the grammar")
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def _build(self, vocab: llama_cpp.llama_vocab_p, p: SamplingParams) -> None:
        if p.grammar:
            grammar = p.grammar.encode("utf-8")
            if p.grammar_triggers:
                patterns = (ctypes.c_char_p * len(p.grammar_triggers))(*(t.encode() for t in p.grammar_triggers))
                self._grammar = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                    vocab, grammar, p.grammar_root.encode(), patterns, len(p.grammar_triggers), None, 0
                )
            else:
                self._grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar, p.grammar_root.encode())
            if not self._grammar:
                self._grammar = None
                raise GrammarError("llama.cpp rejected the grammar")
        if p.penalized:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    self._n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if p.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(p.temperature))
        seed = llama_cpp.LLAMA_DEFAULT_SEED if p.seed is None else p.seed
        self._add(llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, ctx: llama_cpp.llama_context_p, index: int) -> int:
        """Sample from output `index` of the last decode and accept the token."""
        if self._argmax:
            return int(self._logits(ctx, index).argmax())
        if self._grammar is None:
            return llama_cpp.llama_sampler_sample(self._chain, ctx, index)
        token = self._pick(ctx, index, grammar_first=False)
        one: Any = self._one  # built with the grammar; ctypes fields take plain numbers
        one[0].id, one[0].logit, one[0].p = token, 0.0, 0.0
        single = llama_cpp.llama_token_data_array(one, 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(single))
        if one[0].logit == float("-inf"):  # the grammar says no: sample again among what it allows
            shortlisted = self._shortlist_pick(ctx, index)
            token = self._pick(ctx, index, grammar_first=True) if shortlisted is None else shortlisted
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _logits(self, ctx: llama_cpp.llama_context_p, index: int) -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(self._n_vocab,))

    def _shortlist_pick(self, ctx: llama_cpp.llama_context_p, index: int) -> int | None:
        """The grammar-constrained pick made among the most likely tokens, or None when a shortlist
        cannot show it is the pick the whole vocabulary would give."""
        enough = self._enough
        if enough is None:
            return None
        logits = self._logits(ctx, index)
        for size in SHORTLISTS:
            if size * 2 > self._n_vocab:
                return None
            # In vocabulary order, as the whole array is (equal logits go to the lower id, as there).
            ids = np.sort(np.argpartition(logits, -size)[-size:]).astype(np.int32)
            view = self._view[:size]
            view["id"] = ids
            view["logit"] = logits[ids]
            view["p"] = 0.0
            cur = llama_cpp.llama_token_data_array(self._cells, size, -1, False)
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(cur))
            if int(np.isfinite(view["logit"]).sum()) >= enough:
                llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(cur))
                return int(cur.data[cur.selected].id)
        return None

    def _pick(self, ctx: llama_cpp.llama_context_p, index: int, *, grammar_first: bool) -> int:
        logits = self._logits(ctx, index)
        view = self._view
        view["id"] = self._ids  # earlier samplers may have reordered cells
        view["logit"] = logits
        view["p"] = 0.0
        cur = llama_cpp.llama_token_data_array(self._cells, self._n_vocab, -1, False)
        if grammar_first:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(cur))
            if not np.isfinite(view["logit"]).any():  # accepting any token now would abort llama.cpp
                raise GrammarError("no token of this model's vocabulary can continue it")
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(cur))
        return int(cur.data[cur.selected].id)

    def close(self) -> None:
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
