"""`POST /api/embed` and the older `POST /api/embeddings` in Ollama's shapes (scope `responses:create`).

Why: retrieval features of the apps that speak Ollama (Open WebUI's documents,
AnythingLLM, Continue's codebase index, LangChain's `OllamaEmbeddings`) ask
`/api/embed` for vectors. They come from the same embedder as `/v1/embeddings`
(batched with every other request, cancelled when the client leaves), L2-normalised.
`truncate` is Ollama's: on by default, an input longer than the model's window is cut
to the window instead of refused; with `truncate: false` it is a 400 naming the input.
"""

from __future__ import annotations

import asyncio
import re
import time

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.embedding import EmbedCancel, Embeddings
from lmsp_tray.errors import ContextLengthExceeded
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.ollama.models import resolve, service_of
from lmsp_tray.http.routes import JSON, read_parsed
from lmsp_tray.http.sse import unless_client_leaves
from lmsp_tray.protocol.embeddings import EmbeddingRequest
from lmsp_tray.protocol.ollama_requests import EmbedAsk, parse_embed, parse_legacy_embed
from lmsp_tray.serving.embeddings import embed as embed_vectors
from lmsp_tray.serving.service import Service

_INDEX = re.compile(r"^input\[(\d+)\]$")


async def _cut(service: Service, entry: ModelEntry, text: str) -> list[int]:
    """`text` as the model's tokens, cut to its window (the model is loaded: it just refused the text)."""
    model = service.models.get(entry.id)
    if model is None:
        model = await asyncio.to_thread(service.models.acquire, entry)
    tokens = await asyncio.to_thread(model.tokenize_prompt, text)
    trained = entry.info.context_length if entry.info is not None else None
    return tokens[: min(model.context_length, trained or model.context_length)]


async def vectors(request: Request, ask: EmbedAsk) -> tuple[ModelEntry, Embeddings]:
    """The vectors of `ask.inputs`; with `truncate`, an input over the window is cut to it and sent again."""
    service = service_of(request)
    entry = resolve(service, ask.model)
    inputs: list[str | tuple[int, ...]] = list(ask.inputs)
    for _ in range(len(inputs) + 1):
        cancel = EmbedCancel()
        work = embed_vectors(service, EmbeddingRequest(entry.id, tuple(inputs), "float", ask.dimensions), cancel=cancel)
        try:
            _, result = await unless_client_leaves(request.receive, work, cancel.cancel)
            return entry, result
        except ContextLengthExceeded as exc:  # `InputTooLong`, as it crosses from the model process
            where = _INDEX.match(exc.param or "")
            item = inputs[int(where.group(1))] if where else None
            if not ask.truncate or where is None or not isinstance(item, str):
                raise
            inputs[int(where.group(1))] = tuple(await _cut(service, entry, item))
    raise AssertionError("every input was cut already")  # pragma: no cover


async def embed(request: Request) -> Response:
    arrived = time.monotonic_ns()
    ask = await read_parsed(request, parse_embed)
    if not ask.inputs:  # Ollama's clients load an embedding model this way
        entry = resolve(service_of(request), ask.model)
        await asyncio.to_thread(service_of(request).models.acquire, entry, keep_alive=ask.keep_alive)
        return JSON({"model": ask.model, "embeddings": []})
    _, result = await vectors(request, ask)
    rows = await asyncio.to_thread(result.vectors.tolist) if len(ask.inputs) > 16 else result.vectors.tolist()
    return JSON(
        {
            "model": ask.model,
            "embeddings": rows,
            "total_duration": time.monotonic_ns() - arrived,
            "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens,
        }
    )


async def embeddings(request: Request) -> Response:
    ask = await read_parsed(request, parse_legacy_embed)
    if not ask.inputs:
        resolve(service_of(request), ask.model)
        return JSON({"embedding": []})
    _, result = await vectors(request, ask)
    return JSON({"embedding": result.vectors[0].tolist()})


ROUTES = [
    Scoped("/api/embed", embed, POST="responses:create"),
    Scoped("/api/embeddings", embeddings, POST="responses:create"),
]
