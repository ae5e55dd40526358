"""What the scheduler and the embedder use of a loaded model: its llama.cpp handles and a few lookups.

Why protocols: the scheduler (`scheduler.Scheduler`) and the embedder (`embedder.Embedder`) are
built by the model (`model.LlamaModel`) and drive its context; typed against the whole model
class they imported it back, an import circle, and could reach any of its members. They see these
few instead, and `LlamaModel` provides them (tests may hand in something smaller). Freeing a
context and its model (`free_handles`) lives here too: the main and the draft model both do it.
"""

from __future__ import annotations

from typing import Protocol

import llama_cpp


def free_handles(ctx: llama_cpp.llama_context_p | None, model: llama_cpp.llama_model_p | None) -> None:
    """Free a llama.cpp context, then the model it was made from (either may be unset): the main model's
    close and failed load attempt, and the draft model's close, in the one order llama.cpp needs."""
    if ctx:
        llama_cpp.llama_free(ctx)
    if model:
        llama_cpp.llama_model_free(model)


class ContextHandles(Protocol):
    """A model's name (for logs and thread names), its llama.cpp context and that context's memory."""

    @property
    def id(self) -> str: ...  # pragma: no cover

    @property
    def ctx(self) -> llama_cpp.llama_context_p: ...  # pragma: no cover

    @property
    def memory(self) -> llama_cpp.llama_memory_t: ...  # pragma: no cover (NULL: an encoder has none)


class DecodeHandles(ContextHandles, Protocol):
    """What the scheduler decodes and samples with: the vocabulary, the sliding window's size, and
    the text and end-of-generation test of a token."""

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p: ...  # pragma: no cover

    @property
    def n_vocab(self) -> int: ...  # pragma: no cover

    @property
    def n_swa(self) -> int: ...  # pragma: no cover

    def piece(self, token: int, special: bool = False) -> bytes: ...  # pragma: no cover

    def is_eog(self, token: int) -> bool: ...  # pragma: no cover


class EmbedHandles(ContextHandles, Protocol):
    """What the embedder encodes with: the llama.cpp model too (for its embedding size)."""

    @property
    def llama_model(self) -> llama_cpp.llama_model_p: ...  # pragma: no cover
