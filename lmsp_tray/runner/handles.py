"""What the scheduler and the embedder use of a loaded model: its llama.cpp handles and a few lookups.

Why protocols: the scheduler (`scheduler.Scheduler`) and the embedder (`embedder.Embedder`) are
built by the model (`model.LlamaModel`) and drive its context; typed against the whole model
class they imported it back, an import circle, and could reach any of its members. They see these
few instead, and `LlamaModel` provides them (tests may hand in something smaller).
"""

from __future__ import annotations

from typing import Protocol

import llama_cpp


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
