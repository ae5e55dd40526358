"""`POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's shapes over the `/lmsp/v1/responses` responder.

Why here: thin handlers, like `http.routes` — read the body (validated off
the event loop when it is large), start the run through the responder (the
same scheduler, batching, prefix reuse, 429 / 507 and `Idempotency-Key`),
then answer with the finished object or a stream of chunks framed as OpenAI
frames them (bare `data:` lines, then `data: [DONE]`). A client that leaves
— a closed stream, or a sync request whose connection drops — cancels its
run within one decode step, so an editor's next completion never waits
behind the one it abandoned. Scope: `responses:create`, the scope that
already lets an app generate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

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
from lmsp_tray.protocol.openai_chat import parse_chat_create
from lmsp_tray.protocol.openai_chunks import Chunker, ChunkWriter, chat_chunks, chat_completion, openai_error
from lmsp_tray.protocol.openai_completions import CompletionChunks, parse_completion_create, text_completion
from lmsp_tray.protocol.requests import ResponseRequest
from lmsp_tray.serving.replay import iterate
from lmsp_tray.serving.responder import Replayed, Responder

DONE = b"data: [DONE]\n\n"


def encode_chunk(event: Event) -> bytes:
    """One chunk as OpenAI writes it: a bare `data:` line (no `id:`, no `event:`); the stream's own failure
    (`error`, holding a problem document) as OpenAI's error object."""
    data = openai_error(event.data["error"]) if event.name == "error" else event.data
    return b"data: " + wire_json.dumpb(data) + b"\n\n"


def _stream(events: AsyncIterator[Event], chunker: Chunker, request: Request, **kwargs: Any) -> EventStream:
    return EventStream(
        chat_chunks(events, chunker), encode=encode_chunk, trailer=DONE, keepalive=keepalive(request), **kwargs
    )


async def _answer(
    request: Request, parsed: ResponseRequest, chunker: Chunker, final: Callable[[dict[str, Any]], dict[str, Any]]
) -> Response | EventStream:
    """Run `parsed` through the responder; answer with `final(response)` or the chunks of its events."""
    responder: Responder = request.app.state.responder
    run = await responder.start(parsed, caller=caller_of(request), key=idempotency_key(request))
    if isinstance(run, Replayed):
        if run.events is not None:
            return _stream(iterate(run.events), chunker, request, headers=REPLAYED)
        return JSON(final(run.body) if run.body is not None else None, status_code=run.status, headers=REPLAYED)
    if parsed.stream:
        return _stream(run.events(), chunker, request, on_disconnect=run.cancel)
    result = asyncio.ensure_future(run.result())
    gone = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            run.cancel()  # client left: stop generating now
        return JSON(final(await result))
    finally:
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone


async def create_chat_completion(request: Request) -> Response | EventStream:
    chat = await off_loop(lambda raw: parse_chat_create(decode_json(raw)), await read_body(request))
    chunker = ChunkWriter(chat.request.model, include_usage=chat.include_usage)
    return await _answer(request, chat.request, chunker, chat_completion)


async def create_completion(request: Request) -> Response | EventStream:
    done = await off_loop(lambda raw: parse_completion_create(decode_json(raw)), await read_body(request))
    chunker = CompletionChunks(done.request.model, include_usage=done.include_usage, echo=done.echo)
    return await _answer(request, done.request, chunker, lambda response: text_completion(response, echo=done.echo))


CHAT_ROUTES = [
    Scoped("/chat/completions", create_chat_completion, POST="responses:create"),
    Scoped("/completions", create_completion, POST="responses:create"),
]
