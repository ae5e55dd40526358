"""`POST /v1/embeddings` in OpenAI's shape (scope `responses:create`: it runs a model, as a response does).

Why: retrieval features of the apps people use (RAG in chat front-ends,
codebase indexing in editor assistants, LangChain/LlamaIndex vector stores)
ask an OpenAI-compatible server for embeddings. The body is validated off
the event loop when it is large (a batch of 2048 documents); the vectors
come back as floats or base64 float32; a large answer is serialised off the
loop too. A client that disconnects before its answer cancels the request, as
one of `/v1/completions` does: the model stops embedding the inputs left of
its batch and its place in the queue is free for the next request.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.engine.embedding import EmbedCancel, Embeddings
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, read_parsed
from lmsp_tray.http.sse import unless_client_leaves
from lmsp_tray.http.wire_json import dumpb
from lmsp_tray.protocol.embeddings import parse_embedding_create
from lmsp_tray.serving.embeddings import embed, openai_list
from lmsp_tray.serving.service import Service

INLINE_ANSWER_ROWS = 16  # a larger answer is serialised on a worker thread


def _service(request: Request) -> Service:
    return request.app.state.service


def _answer(model_id: str, result: Embeddings, encoding_format: str) -> bytes:
    return dumpb(openai_list(model_id, result, encoding_format))


async def create_embeddings(request: Request) -> Response:
    parsed = await read_parsed(request, parse_embedding_create)
    cancel = EmbedCancel()
    work = asyncio.ensure_future(embed(_service(request), parsed, cancel=cancel))
    try:  # the client left: stop embedding the rest of its inputs now
        model_id, result = await unless_client_leaves(request.receive, work, cancel.cancel)
    finally:
        if not work.done():  # this handler itself was cancelled (the server stops)
            cancel.cancel()
    if len(result.vectors) <= INLINE_ANSWER_ROWS:
        return JSON(openai_list(model_id, result, parsed.encoding_format))
    body = await asyncio.to_thread(_answer, model_id, result, parsed.encoding_format)
    return Response(body, media_type="application/json")


EMBEDDING_ROUTES = [
    Scoped("/embeddings", create_embeddings, POST="responses:create"),
]
