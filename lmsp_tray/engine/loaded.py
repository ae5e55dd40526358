"""What the rest of the service may ask of a loaded model, wherever it runs.

`LoadedModel` is the one interface above the engine: `process.ModelProcess`
implements it for a model running in its own process, `runner.model.LlamaModel`
inside that process (and in tests that load a model in theirs), and tests
implement it with fakes (`ModelManager` takes a factory). It answers what the
service needs (window, placement, template, markers, tokenization) and runs
`GenerationJob`s. Nothing here imports llama.cpp, so the service side of a
model process never loads it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.embedding import EmbedCancel, Embeddings
from lmsp_tray.engine.jobs import AudioClip, GenerationJob, ImagePixels
from lmsp_tray.engine.load_plan import LoadPlan
from lmsp_tray.engine.templates import ChatTemplate


@dataclass(frozen=True)
class Placement:
    """Where a loaded model runs, as reported to users."""

    device: str  # "cpu" or "gpu"
    gpu_layers: int
    total_layers: int
    threads: int
    description: str
    gpu_fallback: str | None = None  # why fewer layers than planned run on the GPU (it ran out of memory)


@dataclass(frozen=True)
class ModelStats:
    """A loaded model's counters (tests and diagnostics)."""

    steps: int = 0  # decode steps performed
    queued: int = 0  # jobs waiting for a sequence slot
    generating: int = 0  # jobs holding a slot
    # tokens decoded by each recent step (an embedding model: inputs per decode); only when asked for
    batch_sizes: tuple[int, ...] = ()
    cancelled: int = 0  # an embedding model: requests stopped because their client went away
    drafted: int = 0  # speculative draft tokens proposed (verified) since the load
    accepted: int = 0  # of those, the ones kept
    model_drafted: int = 0  # of the drafted, the draft model's (`LoadPlan.draft_id`)
    model_accepted: int = 0  # of those, the ones kept
    pid: int | None = None  # the model process, when it runs in one
    taken_at: float = field(default_factory=time.monotonic)


class LoadedModel(Protocol):
    """A model ready to generate. Its methods are thread-safe; none needs the event loop."""

    id: str
    entry: ModelEntry
    plan: LoadPlan
    loaded_at: float  # wall clock
    load_seconds: float
    context_length: int  # tokens per sequence
    parallel: int  # sequences decoded together
    placement: Placement
    template: ChatTemplate
    sliding_window: bool  # some layers keep a window only: it goes back only to where it checkpointed

    @property
    def busy(self) -> bool:
        """True while any job is waiting or generating (the model must not be evicted)."""
        ...  # pragma: no cover

    @property
    def last_activity(self) -> float:
        """time.monotonic() of the last submit or decode step."""
        ...  # pragma: no cover

    def render(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> str: ...  # pragma: no cover

    def find_token(self, text: str) -> int | None: ...  # pragma: no cover

    def is_control(self, token: int) -> bool: ...  # pragma: no cover

    def tokenize_prompt(self, text: str, *, at_most: int | None = None) -> list[int]:
        """The prompt's tokens; with `at_most`, a text that surely needs more is refused without
        tokenizing it (`ContextLengthExceeded`)."""
        ...  # pragma: no cover

    def longest_piece(self) -> int:
        """The most bytes of text one token stands for (worked out once, at the first ask): a text of
        `n` bytes is at least `n / longest_piece()` tokens, whatever it says."""
        ...  # pragma: no cover

    def measure(self, prompt: Sequence[int], media: Sequence[ImagePixels | AudioClip]) -> int:
        """How many tokens `prompt` is with each IMAGE_SLOT replaced by the tokens of the next of `media`, as
        the projector cuts them (preprocessed, not encoded)."""
        ...  # pragma: no cover

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True, with_pieces: bool = False
    ) -> list[Any]:
        """`text`'s tokens (with `with_pieces`, `{"id", "piece"}` each), as llama-server's `/tokenize`."""
        ...  # pragma: no cover

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens` (special tokens written out); a token outside the vocabulary is a 400."""
        ...  # pragma: no cover

    def fim_tokens(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt from the model's FIM tokens; `UnsupportedCapability` without them."""
        ...  # pragma: no cover

    def submit(self, job: GenerationJob) -> None:
        """Queue `job`; raises 503 (unloading) or 429 (waiting line full, with Retry-After) at once."""
        ...  # pragma: no cover

    def embed(self, inputs: Sequence[str | Sequence[int]], *, cancel: EmbedCancel | None = None) -> Embeddings:
        """One L2-normalised vector per input (a text, or tokens), blocking; an input longer than the
        window is refused (`InputTooLong`, naming its index) before anything is decoded. Only an
        embedding model (`GGUFInfo.embeddings`) embeds; others raise `UnsupportedCapability`.
        `cancel.cancel()` (any thread) stops it within a decode: it raises `RequestCancelled`."""
        ...  # pragma: no cover

    def rerank(self, pairs: Sequence[tuple[str, str]], *, cancel: EmbedCancel | None = None) -> Embeddings:
        """A reranker's (`GGUFInfo.rerank`) classifier output for each (query, document) pair, row i
        (column 0: the relevance score), batched and cancelled as `embed` is."""
        ...  # pragma: no cover

    def stats(self, *, batches: bool = False) -> ModelStats: ...  # pragma: no cover

    def close(self, *, drain: bool = False) -> None:
        """Stop (letting running work finish with `drain`) and free the model."""
        ...  # pragma: no cover
