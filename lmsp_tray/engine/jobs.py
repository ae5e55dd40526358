"""What the service hands a model to generate, and how the model reports back.

A `GenerationJob` carries the prompt tokens, sampling, limits and a `sink`
callback. The scheduler thread calls the sink with text deltas as tokens are
decoded and once with a `Finish`. The sink must be cheap and thread-safe
(the service's sink just hands the item to the event loop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.errors import LMSPError

# Finish reasons
STOP = "stop"  # end-of-generation token or a stop string
LENGTH = "length"  # max_output_tokens reached
CONTEXT = "context"  # the context window is full
CANCELLED = "cancelled"
ERROR = "error"


@dataclass(frozen=True)
class Finish:
    reason: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the KV cache
    error: LMSPError | None = None


TextSink = Callable[[str | Finish], None]
# Called in the scheduler thread with each token's bytes; returns the grammar rule to switch
# `sampling.grammar` on from (a lazy grammar), or None to keep decoding freely.
GrammarTrigger = Callable[[bytes], str | None]


@dataclass(eq=False)
class GenerationJob:
    prompt: Sequence[int]
    sampling: SamplingParams
    max_tokens: int
    sink: TextSink
    stop: Sequence[str] = ()
    # Stop when one of these token ids is produced, besides the model's end-of-generation tokens.
    stop_tokens: frozenset[int] = frozenset()
    # With a trigger, `sampling.grammar` is off until the trigger names the rule to start from.
    grammar_trigger: GrammarTrigger | None = None
    # Control tokens whose text is part of the output (call and thinking markers the parser reads).
    visible_tokens: frozenset[int] = frozenset()
    # Filled in and read across threads:
    cancel_event: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # when its prompt started to be evaluated
    first_token_at: float | None = None

    def cancel(self) -> None:
        """Ask the scheduler to stop this job; it stops within one decode step."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()
