"""What discovery knows about one model file: the contract the rest of the service reads.

Discovery fills these from GGUF headers (never the weights); the engine,
the catalog and the API only read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Encoder-only architectures llama.cpp runs as embedding models (their GGUFs may omit pooling_type).
EMBEDDING_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert", "modern-bert",
     "gemma-embedding", "t5encoder"}
)  # fmt: skip
RANK_POOLING = 4


@dataclass(frozen=True)
class GGUFInfo:
    """Header facts of one GGUF model (all optional: files in the wild omit keys)."""

    architecture: str | None = None  # general.architecture, e.g. "llama", "gemma3", "qwen3"
    name: str | None = None  # general.name
    basename: str | None = None  # general.basename
    size_label: str | None = None  # general.size_label, e.g. "270M"
    file_type: int | None = None  # general.file_type (llama_ftype)
    quantization: str | None = None  # e.g. "Q4_K_M", from file_type or the file name
    context_length: int | None = None  # <arch>.context_length (trained window)
    block_count: int | None = None
    embedding_length: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    key_length: int | None = None  # <arch>.attention.key_length (else embedding/head_count)
    value_length: int | None = None
    chat_template: str | None = None  # tokenizer.chat_template
    bos_token: str | None = None  # text of tokenizer.ggml.bos_token_id, when known
    eos_token: str | None = None
    split_count: int = 1  # split.count
    parameter_count: int | None = None  # general.parameter_count, if present
    general_type: str | None = None  # general.type: "model", "adapter", "mmproj", "imatrix", ...
    tensor_count: int | None = None  # tensors in this file (0 for a vocab-only file)
    vocab_size: int | None = None  # entries in tokenizer.ggml.tokens
    split_index: int | None = None  # split.no (0 for the first part of a split model)
    pooling_type: int | None = None  # <arch>.pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker)
    fim_tokens: bool = False  # fill-in-the-middle prefix, suffix and middle tokens, as llama.cpp finds them
    vision_encoder: bool = False  # clip.has_vision_encoder (a projector's header)
    audio_encoder: bool = False  # clip.has_audio_encoder

    @property
    def embeddings(self) -> bool:
        """An embedding model: an encoder architecture, or any GGUF that declares how to pool its
        outputs into one vector (e.g. a Qwen3-Embedding with last-token pooling). Such a model
        answers `/v1/embeddings` only; a reranker (`rank` pooling) is neither."""
        if self.pooling_type == RANK_POOLING:
            return False
        return self.architecture in EMBEDDING_ARCHITECTURES or self.pooling_type in (1, 2, 3)

    @property
    def rerank(self) -> bool:
        """A reranker (`rank` pooling: bge-reranker, jina-reranker, Qwen3-Reranker): it scores how well a
        document answers a query and answers `/v1/rerank` only; it runs as an embedding model does."""
        return self.pooling_type == RANK_POOLING

    @property
    def kind(self) -> str:
        """What the file holds: "model", or "mmproj" / "vocab" / "adapter" / ... (not runnable alone)."""
        if self.architecture == "clip" or self.general_type in {"mmproj", "clip"}:
            return "mmproj"
        if self.general_type and self.general_type != "model":
            return self.general_type
        if self.tensor_count == 0 and self.split_count <= 1:
            return "vocab"
        return "model"

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int | None:
        """KV-cache bytes one token costs (f16 cache), or None when the header lacks the facts."""
        if not (self.block_count and self.head_count_kv):
            return None
        head_dim = None
        if self.embedding_length and self.head_count:
            head_dim = self.embedding_length // self.head_count
        k = self.key_length or head_dim
        v = self.value_length or head_dim
        if not (k and v):
            return None
        return self.block_count * self.head_count_kv * (k + v) * bytes_per_value


@dataclass(frozen=True)
class Projector:
    """A model's multimodal projector (an ``mmproj`` GGUF found beside it) and the inputs it encodes,
    read from its header: llama.cpp's multimodal library loads it next to the model."""

    path: Path
    size_bytes: int
    vision: bool
    audio: bool


@dataclass
class ModelEntry:
    """One model the catalog offers: an id, where its file(s) are, and what its header says."""

    id: str
    path: Path  # the file llama.cpp opens (the first part of a split model)
    source: str  # "lmsp-tray" | "custom" | "lm-studio" | "ollama" | "huggingface" | "llama.cpp"
    size_bytes: int
    files: tuple[Path, ...] = ()
    info: GGUFInfo | None = None
    error: str | None = None  # why the header could not be read; the model shows state "error"
    extra: dict[str, Any] = field(default_factory=dict)
    incomplete: bool = False  # the file ends too early (a download or copy still running, or cut short)
    projector: Projector | None = None  # the mmproj file paired with it (same folder or Ollama manifest)

    @property
    def ok(self) -> bool:
        return self.error is None and self.info is not None

    @property
    def vision(self) -> bool:
        """Whether the model takes images: it has a projector with a vision encoder."""
        return self.ok and self.projector is not None and self.projector.vision

    @property
    def audio(self) -> bool:
        """Whether the model takes audio: it has a projector with an audio encoder."""
        return self.ok and self.projector is not None and self.projector.audio

    @property
    def input_modalities(self) -> list[str]:
        """What the model reads: "text", plus "image" / "audio" from its projector."""
        out = ["text"]
        if self.ok and self.projector is not None:
            if self.projector.vision:
                out.append("image")
            if self.projector.audio:
                out.append("audio")
        return out


@dataclass(frozen=True)
class IncompleteFile:
    """A file whose GGUF header is not all there yet (empty, or cut inside the header).

    It is not offered as a model: what it will be called depends on a header not written yet, so
    any id given now would change once the copy completes. The catalog lists it apart
    (`Catalog.incomplete_files()`), for the tray and `lmsp-tray models`.
    """

    path: Path
    source: str
    size_bytes: int
    error: str
