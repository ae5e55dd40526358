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

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import Answer, answer_run, read_parsed
from lmsp_tray.http.sse import DONE, EventStream, frame
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.openai_chat import parse_chat_create
from lmsp_tray.protocol.openai_chunks import Chunker, ChunkWriter, chat_chunks, chat_completion, openai_error
from lmsp_tray.protocol.openai_completions import CompletionChunks, parse_completion_create, text_completion
from lmsp_tray.serving.replay import iterate


def encode_chunk(event: Event) -> bytes:
    """One chunk as OpenAI writes it: a bare `data:` line (no `id:`, no `event:`); the stream's own failure
    (`error`, holding a problem document) as OpenAI's error object."""
    data = openai_error(event.data["error"]) if event.name == "error" else event.data
    return frame(data)


def _chunked(chunker: Chunker, final: Callable[[dict[str, Any]], dict[str, Any]]) -> Answer:
    """A run's answer as OpenAI's: `final(response)`, or the chunks of its events, then `data: [DONE]`."""
    return Answer(
        final=final,
        live=lambda events: chat_chunks(events, chunker),
        replayed=lambda events: chat_chunks(iterate(events), chunker),
        encode=encode_chunk,
        trailer=DONE,
    )


async def create_chat_completion(request: Request) -> Response | EventStream:
    chat = await read_parsed(request, parse_chat_create)
    chunker = ChunkWriter(chat.request.model, include_usage=chat.include_usage)
    return await answer_run(request, chat.request, _chunked(chunker, chat_completion))


async def create_completion(request: Request) -> Response | EventStream:
    done = await read_parsed(request, parse_completion_create)
    chunker = CompletionChunks(done.request.model, include_usage=done.include_usage, echo=done.echo)
    return await answer_run(
        request, done.request, _chunked(chunker, lambda response: text_completion(response, echo=done.echo))
    )


CHAT_ROUTES = [
    Scoped("/chat/completions", create_chat_completion, POST="responses:create"),
    Scoped("/completions", create_completion, POST="responses:create"),
]
