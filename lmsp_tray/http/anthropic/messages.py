"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's shapes over the responder.

Why here: thin handlers, like `http.openai.chat` — read the body (validated
off the event loop when it is large), start the run through the responder
(the same scheduler, batching, prefix reuse, 429 / 507 and `Idempotency-Key`),
then answer with the finished message or Anthropic's event stream (`event:` /
`data:` lines, a `ping` event as the keep-alive). A client that leaves cancels
its run within one decode step. Scope: `responses:create`, the scope that
already lets an app generate.

`thinking: enabled` asks for the model's reasoning where it has one; a model
without it answers without thinking (Claude Code asks for thinking of every
model it is pointed at), rather than refusing.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.http import wire_json
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, Answer, answer_run, read_parsed
from lmsp_tray.http.sse import EventStream
from lmsp_tray.protocol.anthropic import AnthropicRequest, parse_count_tokens, parse_message_create
from lmsp_tray.protocol.anthropic_events import PING, MessageStream, message, problem_error
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.openai_chunks import chat_chunks  # a run's events through a writer's `feed`
from lmsp_tray.serving.replay import iterate
from lmsp_tray.serving.service import Service

PING_FRAME = b"event: ping\ndata: " + wire_json.dumpb(PING) + b"\n\n"


def _service(request: Request) -> Service:
    return request.app.state.service


def encode(event: Event) -> bytes:
    """One event as Anthropic frames it: `event:` and `data:` lines (no `id:`); the stream's own failure
    (`error`, holding a problem document) as Anthropic's error event."""
    problem = event.data.get("error")
    if event.name == "error" and isinstance(problem, dict) and "status" in problem:  # a problem document
        return _frame(problem_error(problem))
    return _frame(event.data)


def _frame(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + wire_json.dumpb(data) + b"\n\n"


def _fit_thinking(service: Service, parsed: AnthropicRequest) -> None:
    """Thinking asked of a model that has none: answered without it (see the module docstring)."""
    if parsed.request.reasoning:
        entry = service.entry(parsed.request.model, param="model")
        if "reasoning" not in service.model_capabilities(entry):
            parsed.request.reasoning = None


def _with_notes(body: dict[str, Any], parsed: AnthropicRequest) -> dict[str, Any]:
    if parsed.left_out:  # Anthropic's own tools, which the model was not offered
        body["extensions"] = {"lmsp_tray": {"tools_left_out": parsed.left_out}}
    return body


async def create_message(request: Request) -> Response | EventStream:
    parsed = await read_parsed(request, parse_message_create)
    _fit_thinking(_service(request), parsed)

    def stream(events: Any) -> Any:
        return chat_chunks(events, MessageStream(parsed.model, notes=_with_notes({}, parsed)))

    answer = Answer(
        final=lambda response: _with_notes(message(response, parsed.model), parsed),
        live=stream,
        replayed=lambda events: stream(iterate(events)),
        encode=encode,
        ping=PING_FRAME,
    )
    return await answer_run(request, parsed.request, answer)


async def count_tokens(request: Request) -> Response:
    parsed = await read_parsed(request, parse_count_tokens)
    service = _service(request)
    _fit_thinking(service, parsed)
    return JSON({"input_tokens": await service.count_tokens(parsed.request)})


MESSAGE_ROUTES = [
    Scoped("/messages", create_message, POST="responses:create"),
    Scoped("/messages/count_tokens", count_tokens, POST="responses:create"),
]
