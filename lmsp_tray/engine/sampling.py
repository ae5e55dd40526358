"""Per-request sampling: the parameters, and the llama.cpp sampler chain built from them.

Each request gets its own sampler chain (its own seed, penalties history and
grammar state), so requests decoded together in one batch never influence
each other's sampling.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05


class GrammarError(ValueError):
    """llama.cpp could not parse a grammar."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None  # None: a random seed
    grammar: str | None = None  # GBNF
    grammar_root: str = "root"  # the rule decoding starts from
    # With trigger patterns the grammar only applies once one matches (lazy grammar).
    grammar_triggers: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """An owned llama.cpp sampler chain; `sample()` picks and accepts the next token."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p, params: SamplingParams) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        try:
            self._build(vocab, params)
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
                self._add(
                    llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                        vocab, grammar, p.grammar_root.encode(), patterns, len(p.grammar_triggers), None, 0
                    )
                )
            else:
                self._add(llama_cpp.llama_sampler_init_grammar(vocab, grammar, p.grammar_root.encode()))
        if p.repeat_penalty != 1.0:
            self._add(llama_cpp.llama_sampler_init_penalties(p.repeat_last_n, p.repeat_penalty, 0.0, 0.0))
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
        return llama_cpp.llama_sampler_sample(self._chain, ctx, index)

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
