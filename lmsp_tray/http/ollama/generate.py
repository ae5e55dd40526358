"""`POST /api/chat` and `POST /api/generate`: Ollama's shapes over the same responder as `/v1` and `/lmsp/v1`.

Why here: thin handlers, like `http.openai.chat` — read the body (validated off the
event loop when it is large), resolve the model's name as Ollama does, start the
run through the responder (the same scheduler, batching, prefix reuse, template,
grammars for tools and `format`, stop strings, 429 / 507), then answer with NDJSON
lines (the default) or, with `stream: false`, the same lines folded into one
object. A client that leaves — a closed stream, or a sync request whose connection
drops — cancels its run within one decode step. A body with no messages / no
prompt loads the model (or, with `keep_alive: 0`, unloads it), as Ollama's clients
use it to warm a model up. Scope: `responses:create`, the scope that lets an app
generate.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import InternalError
from lmsp_tray.http import wire_json
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.ollama.models import resolve, service_of
from lmsp_tray.http.routes import JSON, caller_of, read_parsed
from lmsp_tray.http.sse import EventStream, unless_client_leaves
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.ollama_requests import Lifecycle, OllamaRun, parse_chat, parse_generate
from lmsp_tray.protocol.ollama_stream import (
    CHAT,
    GENERATE,
    Clock,
    OllamaLines,
    created_at,
    error_text,
    fold,
    ollama_lines,
)
from lmsp_tray.serving.responder import Responder, Started

NDJSON = "application/x-ndjson"


def encode_line(event: Event) -> bytes:
    """One NDJSON line; the stream's own failure (`error`, holding a problem document) as `{"error": "…"}`."""
    data = event.data
    if "error" in data:
        data = {"error": error_text(data["error"])}
    return wire_json.dumpb(data) + b"\n"


async def _lines(events: AsyncIterator[Event], writer: OllamaLines) -> list[dict[str, Any]]:
    return [line.data async for line in ollama_lines(events, writer)]


def _finished(model: str, kind: str, reason: str) -> dict[str, Any]:
    """The one line a load or an unload answers with (`done_reason` "load" / "unload")."""
    empty: dict[str, Any] = {"message": {"role": "assistant", "content": ""}} if kind == CHAT else {"response": ""}
    return {"model": model, "created_at": created_at(), **empty, "done": True, "done_reason": reason}


async def _lifecycle(request: Request, asked: Lifecycle, kind: str) -> Response:
    service = service_of(request)
    entry = resolve(service, asked.model)
    if asked.unload:
        await asyncio.to_thread(service.models.unload, entry.id)
        return JSON(_finished(asked.model, kind, "unload"))
    await asyncio.to_thread(service.models.acquire, entry, keep_alive=asked.keep_alive)
    return JSON(_finished(asked.model, kind, "load"))


async def _answer(request: Request, parse: Callable[[Any], OllamaRun | Lifecycle], kind: str) -> Response | EventStream:
    clock = Clock()  # the request has arrived: Ollama's durations count from here
    parsed = await read_parsed(request, parse)
    if isinstance(parsed, Lifecycle):
        return await _lifecycle(request, parsed, kind)
    entry = resolve(service_of(request), parsed.model)
    run_request = dataclasses.replace(parsed.request, model=entry.id)
    responder: Responder = request.app.state.responder
    started = await responder.start(run_request, caller=caller_of(request))
    assert isinstance(started, Started)  # no Idempotency-Key, so never a replay
    clock.start()
    writer = OllamaLines(kind, parsed.model, clock)
    if run_request.stream:
        return EventStream(
            ollama_lines(started.events(), writer),
            on_disconnect=started.cancel,
            encode=encode_line,
            keepalive=None,
            media_type=NDJSON,
        )
    lines = await unless_client_leaves(request.receive, _lines(started.events(), writer), started.cancel)
    answer = fold(lines)
    if "error" in answer or not lines:
        raise started.run.error or InternalError(error_text(answer.get("error")))
    return JSON(answer)


async def chat(request: Request) -> Response | EventStream:
    return await _answer(request, parse_chat, CHAT)


async def generate(request: Request) -> Response | EventStream:
    return await _answer(request, parse_generate, GENERATE)


ROUTES = [
    Scoped("/api/chat", chat, POST="responses:create"),
    Scoped("/api/generate", generate, POST="responses:create"),
]
