"""A request's sampling parameters: plain data the service fills in and sends to the model process.

Why apart from the sampler chain (`runner.sampler`, which builds llama.cpp samplers from these):
the service sets them from a request and `wire` carries them to the model process, and neither
may load llama.cpp to do so.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0  # OpenAI's: minus this times a token's count so far
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token has appeared
    seed: int | None = None  # None: a random seed
    grammar: str | None = None  # GBNF
    grammar_root: str = "root"  # the rule decoding starts from
    # With trigger patterns the grammar only applies once one matches (lazy grammar).
    grammar_triggers: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
