"""`POST /v1/rerank` and `POST /rerank` (scope `responses:create`: it runs a model, as embeddings do).

Why: retrieval apps (Dify, Open WebUI, RAGFlow, Cherry Studio, LangChain's
and LlamaIndex's rerankers) send the query and the documents they found to a
Jina/Cohere-style rerank endpoint and keep the best; llama-server serves it
at both paths. A client that disconnects before its answer cancels the
request, as one of `/v1/embeddings` does.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.engine.embedding import EmbedCancel
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, decode_json, off_loop, read_body
from lmsp_tray.http.sse import unless_client_leaves
from lmsp_tray.protocol.rerank import parse_rerank_create
from lmsp_tray.serving.rerank import rerank, rerank_answer
from lmsp_tray.serving.service import Service


def _service(request: Request) -> Service:
    return request.app.state.service


async def create_rerank(request: Request) -> Response:
    parsed = await off_loop(lambda raw: parse_rerank_create(decode_json(raw)), await read_body(request))
    cancel = EmbedCancel()
    work = asyncio.ensure_future(rerank(_service(request), parsed, cancel=cancel))
    try:  # the client left: stop scoring the rest of its documents now
        ranked = await unless_client_leaves(request.receive, work, cancel.cancel)
    finally:
        if not work.done():  # this handler itself was cancelled (the server stops)
            cancel.cancel()
    return JSON(rerank_answer(parsed, ranked))


RERANK_ROUTES = [Scoped("/rerank", create_rerank, POST="responses:create")]
ROOT_RERANK_ROUTES = [Scoped("/rerank", create_rerank, POST="responses:create")]  # `/rerank`, beside /v1's
