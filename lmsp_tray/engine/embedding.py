"""Embedding jobs and their answers: what the service asks of an embedding model, on either side of the wire.

Why apart from `jobs`: an embedding request is not a stream. It is a list of
inputs (each already tokens) answered once with one vector per input, so it
has no sampler, no deltas and no finish reasons; `runner.embedder.Embedder` packs the
inputs of many requests into few decodes. The vectors travel as packed
float32 (`pack` / `unpack`), the form base64 `encoding_format` wants anyway.
`EmbedCancel` is how a request whose client went away stops its job, on
whichever side of the wire the job runs. Nothing here imports llama.cpp.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lmsp_tray.errors import InvalidRequest, LMSPError, RequestCancelled

# llama.cpp's pooling types (`<arch>.pooling_type` in a GGUF)
POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 0, 1, 2, 3, 4
POOLING_NAMES = {POOLING_NONE: "none", POOLING_MEAN: "mean", POOLING_CLS: "cls", POOLING_LAST: "last"}


@dataclass(frozen=True)
class Embeddings:
    """One L2-normalised float32 vector per input (rows of `vectors`) and each input's token count."""

    vectors: np.ndarray  # shape (inputs, dimensions), float32
    token_counts: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)

    def truncated(self, dimensions: int | None) -> Embeddings:
        """The first `dimensions` components of each vector, normalised again (Matryoshka-style)."""
        width = self.vectors.shape[1]
        if dimensions is None or dimensions == width:
            return self
        if not 1 <= dimensions <= width:
            raise InvalidRequest(
                f"'dimensions' must be between 1 and {width} for this model (its vectors have {width}).",
                param="dimensions",
            )
        return Embeddings(normalized(self.vectors[:, :dimensions]), self.token_counts)


EmbedDone = Callable[[Embeddings | LMSPError], None]


@dataclass(eq=False)
class EmbedJob:
    """Inputs (tokens each) to embed together; `done` is called once, on the embedder's thread."""

    inputs: Sequence[Sequence[int]]
    done: EmbedDone
    vectors: list[np.ndarray | None] = field(default_factory=list)  # filled in by the embedder
    remaining: int = 0
    started: float = 0.0  # time.monotonic() when it was queued
    cancelled: bool = False  # set under the embedder's lock: its inputs left are not embedded


class EmbedCancel:
    """Stops one embedding request from any thread: `cancel()` once, whenever.

    Whoever runs the job says what stopping means with `bind` (the embedder drops
    the job's inputs still waiting; a model process is sent a CANCEL frame) once
    the job is queued; a cancel that came before then runs the hook at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hook: Callable[[], None] | None = None
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def check(self) -> None:
        """Raise `RequestCancelled` once cancelled (before work that no one will read begins)."""
        if self._cancelled:
            raise RequestCancelled("The client went away; its embeddings were not computed.")

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            hook = self._hook
        if hook is not None:
            hook()

    def bind(self, hook: Callable[[], None]) -> None:
        with self._lock:
            self._hook = hook
            cancelled = self._cancelled
        if cancelled:
            hook()


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


def pack(result: Embeddings) -> bytes:
    """u32 JSON length, JSON head {rows, dims, tokens}, then little-endian float32 rows."""
    rows, dims = result.vectors.shape
    head = json.dumps({"rows": rows, "dims": dims, "tokens": list(result.token_counts)}).encode()
    return struct.pack("<I", len(head)) + head + result.vectors.astype("<f4", copy=False).tobytes()


def unpack(payload: bytes | memoryview) -> Embeddings:
    (size,) = struct.unpack_from("<I", payload)
    head = json.loads(bytes(payload[4 : 4 + size]))
    flat = np.frombuffer(bytes(payload[4 + size :]), dtype="<f4").astype(np.float32, copy=False)
    return Embeddings(flat.reshape(int(head["rows"]), int(head["dims"])), tuple(int(t) for t in head["tokens"]))
