"""Embeddings for `/v1/embeddings`: the model checked, loaded on demand, and asked for its vectors.

Why apart from `service`: an embedding request is one question and one
answer — no run, no events, no store — so it needs only the catalog and the
model manager. The model must be an embedding model (`embeddings` in its
capabilities); a chat model is refused with `unsupported_capability` (see
docs/api-openai.md#embeddings: lmsp-tray does not pool a generative model's states into vectors).
The engine checks every input against the model's window before decoding
(400 naming the input's index) and batches the inputs of all requests;
`dimensions` truncates and normalises again here. A request whose client went
away is stopped through its `EmbedCancel` (the model drops its inputs left and
frees its place); it then ends `RequestCancelled` and is not retried.
"""

from __future__ import annotations

import base64

from lmsp_tray.engine.embedding import EmbedCancel, Embeddings
from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.embeddings import EmbeddingRequest
from lmsp_tray.serving.on_model import ask_model
from lmsp_tray.serving.service import Service


async def embed(
    service: Service, request: EmbeddingRequest, *, cancel: EmbedCancel | None = None
) -> tuple[str, Embeddings]:
    """The model's id and the vectors of `request.inputs` (truncated to `dimensions`); after
    `cancel.cancel()` it stops within one decode and raises `RequestCancelled`."""
    entry = service.entry(request.model, param="model")
    if "embeddings" not in service.model_capabilities(entry):
        raise UnsupportedCapability(
            f"'{entry.id}' is not an embedding model; embeddings come from a model made for them (BERT, "
            f"nomic-embed, bge, e5, gte, Qwen3-Embedding, embeddinggemma, ...). GET /v1/models lists each "
            f"model's capabilities.",
            param="model",
        )
    width = entry.info.embedding_length if entry.info else None
    if request.dimensions is not None and width and request.dimensions > width:
        raise InvalidRequest(f"'dimensions' must be between 1 and {width} for '{entry.id}'.", param="dimensions")
    result = await ask_model(service, entry, lambda m: m.embed(list(request.inputs), cancel=cancel), cancel=cancel)
    return entry.id, result.truncated(request.dimensions)


def openai_list(model_id: str, result: Embeddings, encoding_format: str) -> dict[str, object]:
    """OpenAI's embedding list: `data[i].embedding` as floats or base64 float32, and `usage`."""
    if encoding_format == "base64":
        rows: list[object] = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in result.vectors]
    else:
        rows = result.vectors.tolist()
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
        "model": model_id,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }
