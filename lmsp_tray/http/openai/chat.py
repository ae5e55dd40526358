"""`POST /v1/chat/completions`: OpenAI's Chat Completions over the same responder as `/lmsp/v1/responses`.

Why here: a thin handler, like `http.routes` — read the body (validated off
the event loop when it is large), start the run through the responder (the
same scheduler, batching, prefix reuse, 429 / 507 and `Idempotency-Key`),
then answer with a `chat.completion` or a stream of `chat.completion.chunk`s
framed as OpenAI frames them (bare `data:` lines, then `data: [DONE]`).
Scope: `responses:create`, the scope that already lets an app generate.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.http import wire_json
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import (
    JSON,
    REPLAYED,
    caller_of,
    decode_json,
    idempotency_key,
    keepalive,
    off_loop,
    read_body,
)
from lmsp_tray.http.sse import EventStream, wait_disconnect
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.openai_chat import ChatRequest, parse_chat_create
from lmsp_tray.protocol.openai_chunks import ChunkWriter, chat_chunks, chat_completion, openai_error
from lmsp_tray.serving.replay import iterate
from lmsp_tray.serving.responder import Replayed, Responder

DONE = b"data: [DONE]\n\n"


def encode_chunk(event: Event) -> bytes:
    """One chunk as OpenAI writes it: a bare `data:` line (no `id:`, no `event:`); the stream's own failure
    (`error`, holding a problem document) as OpenAI's error object."""
    data = openai_error(event.data["error"]) if event.name == "error" else event.data
    return b"data: " + wire_json.dumpb(data) + b"\n\n"


def chat_stream(events: object, chat: ChatRequest, **kwargs: object) -> EventStream:
    writer = ChunkWriter(chat.request.model, include_usage=chat.include_usage)
    return EventStream(chat_chunks(events, writer), encode=encode_chunk, trailer=DONE, **kwargs)  # type: ignore[arg-type]


async def create_chat_completion(request: Request) -> Response | EventStream:
    responder: Responder = request.app.state.responder
    chat = await off_loop(lambda raw: parse_chat_create(decode_json(raw)), await read_body(request))
    run = await responder.start(chat.request, caller=caller_of(request), key=idempotency_key(request))
    if isinstance(run, Replayed):
        if run.events is not None:
            return chat_stream(iterate(run.events), chat, headers=REPLAYED, keepalive=keepalive(request))
        body = chat_completion(run.body) if run.body is not None else None
        return JSON(body, status_code=run.status, headers=REPLAYED)
    if chat.request.stream:
        return chat_stream(run.events(), chat, on_disconnect=run.cancel, keepalive=keepalive(request))
    result = asyncio.ensure_future(run.result())
    gone = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            run.cancel()  # client left: stop generating now
        return JSON(chat_completion(await result))
    finally:
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone


CHAT_ROUTES = [Scoped("/chat/completions", create_chat_completion, POST="responses:create")]
