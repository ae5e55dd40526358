"""What the service hands a model to generate, and how the model reports back.

A `GenerationJob` carries the prompt tokens, sampling, limits and a `sink`
callback. The model calls the sink, in its own thread, with text deltas as
tokens are decoded, with `GrammarOn` when a lazy grammar switches on (so the
output parser knows, in order with the text, that what follows is
constrained), with a `TokenLogprob` before each token's text when the job asks for log
probabilities, and once with a `Finish`. The sink must be cheap and
thread-safe (the service's sink just hands the item to the event loop).

The service hands a job to `process.ModelProcess`, which sends it to the model
process, where `runner.model.LlamaModel` runs it (tests also run it in their own
process); everything in it is plain data so that it can be sent there, except
the sink and the cancel hook, which stay on this side.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.errors import LMSPError


class FinishReason(enum.StrEnum):
    """Why a generation ended (its value is what the model process sends)."""

    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_output_tokens reached
    CONTEXT = "context"  # the context window is full
    CANCELLED = "cancelled"
    ERROR = "error"


# The short names the model process and the service use.
STOP = FinishReason.STOP
LENGTH = FinishReason.LENGTH
CONTEXT = FinishReason.CONTEXT
CANCELLED = FinishReason.CANCELLED
ERROR = FinishReason.ERROR


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the KV cache
    error: LMSPError | None = None
    stop_sequence: str | None = None  # the request's stop string that ended it, if one did


@dataclass(frozen=True)
class GrammarOn:
    """A lazy grammar switched on: the text that follows is decoded under it."""

    root: str


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability under the model (the softmax of its raw logits, before
    sampling settings), with the `top` most likely tokens of that step; sent just before its text."""

    piece: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


TextSink = Callable[[str | GrammarOn | TokenLogprob | Finish], None]
# Called in the model's thread with each token's bytes; returns the grammar rule to switch
# `sampling.grammar` on from (a lazy grammar), or None to keep decoding freely.
GrammarTrigger = Callable[[bytes], str | None]


IMAGE_SLOT = -1  # where an image (or audio clip) goes in a prompt's tokens; the model process puts its tokens there


@dataclass(frozen=True)
class ImagePixels:
    """A decoded image for the model process: `width` x `height` RGB pixels, 3 bytes each, row by row."""

    width: int
    height: int
    rgb: bytes


@dataclass(frozen=True)
class AudioClip:
    """An audio file for the model process, as sent (WAV, MP3 or FLAC, checked by the service): libmtmd
    decodes it there to the projector's sample rate."""

    data: bytes
    param: str = "input"  # the request part it came from, for the error that names it


class LazyGrammar(Protocol):
    """When a job's grammar switches on: `start()` makes the per-job trigger.

    `roots` names every rule a trigger may switch on from (so the grammar can be
    compiled before the job runs); empty when unknown in advance."""

    @property
    def roots(self) -> tuple[str, ...]: ...  # pragma: no cover

    def start(self) -> GrammarTrigger: ...  # pragma: no cover


@dataclass(eq=False)
class GenerationJob:
    prompt: Sequence[int]
    sampling: SamplingParams
    max_tokens: int
    sink: TextSink
    stop: Sequence[str] = ()
    # Stop when one of these token ids is produced, besides the model's end-of-generation tokens.
    stop_tokens: frozenset[int] = frozenset()
    # With a lazy grammar, `sampling.grammar` is off until its trigger names the rule to start from.
    grammar_trigger: LazyGrammar | None = None
    # Control tokens whose text is part of the output (call and thinking markers the parser reads).
    visible_tokens: frozenset[int] = frozenset()
    # Report each token's log probability and this many top alternatives (None: no log probabilities).
    logprobs: int | None = None
    # The prompt's first this many tokens stay the same across conversations (system prompt and tools):
    # a sliding-window model checkpoints its window there, so that the next conversation goes on from it.
    stable_prefix: int = 0
    # The images and audio clips of the prompt, in order: each stands at an IMAGE_SLOT of `prompt` (which the
    # model process replaces with the media's own tokens: `prompt` grows by them there).
    images: Sequence[ImagePixels | AudioClip] = ()
    # Filled in by the model process: what evaluates each media id of `prompt` (runner.vision.ImageChunk).
    media: dict[int, Any] = field(default_factory=dict)
    # Filled in and read across threads:
    cancel_event: threading.Event = field(default_factory=threading.Event)
    on_cancel: Callable[[], None] | None = None  # set by a model that runs the job elsewhere
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # when its prompt started to be evaluated
    first_token_at: float | None = None

    def cancel(self) -> None:
        """Ask the model to stop this job; it stops within one decode step."""
        if self.cancel_event.is_set():
            return
        self.cancel_event.set()
        if self.on_cancel is not None:
            self.on_cancel()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()
