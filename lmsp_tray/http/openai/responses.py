"""`/v1/responses`: OpenAI's Responses API over the same machinery as `/lmsp/v1/responses`.

Why: OpenAI's own clients (the SDKs, openai-agents, LangChain, pydantic-ai,
LiteLLM, Codex CLI) assume OpenAI's defaults and shapes; `/lmsp/v1` keeps
LMSP's. The request goes through `protocol.openai_requests` (store on by
default, namespace / custom / hosted tools, `allowed_tools`), then the same
`Responder` — scheduler, conversations, storage, `Idempotency-Key` — as
`/lmsp/v1`, and every answer through an `OpenAIView` (`protocol.openai_shapes`).
Errors before the first byte are OpenAI's error object (the `/v1` Api's
shape); after it, a terminal event.

Scopes: `POST /responses` `responses:create`; `GET /responses/{id}` and
`GET /responses/{id}/input_items` `responses:read`; `DELETE /responses/{id}`
`responses:create` (removing is writing), as on `/lmsp/v1`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import InvalidRequest, ServiceUnavailable
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, Answer, answer_run, caller_of, read_parsed
from lmsp_tray.http.sse import EventStream, encode_without_id
from lmsp_tray.protocol.openai_requests import parse_openai_response_create
from lmsp_tray.protocol.openai_shapes import MAX_INPUT_ITEMS_PAGE, OpenAIView, page
from lmsp_tray.serving.conversations import Conversations
from lmsp_tray.serving.replay import iterate


def _conversations(request: Request) -> Conversations:
    conversations = request.app.state.conversations
    if conversations is None:
        raise ServiceUnavailable("This service runs without its store; stored responses are not available.")
    return conversations


async def create_response(request: Request) -> Response | EventStream:
    parsed, tools = await read_parsed(request, parse_openai_response_create)
    view = OpenAIView(tools)
    answer = Answer(
        final=view.response,
        live=view.events,
        replayed=lambda events: iterate(view.replayed(events)),
        encode=encode_without_id,
    )
    return await answer_run(request, parsed, answer)


async def stored_response(request: Request) -> Response:
    """GET returns a stored response, DELETE removes it; unknown: 404 response_not_found."""
    conversations, rid, owner = _conversations(request), request.path_params["response_id"], caller_of(request).owner
    if request.method == "DELETE":
        deleted = await conversations.delete(rid, owner=owner)
        return JSON({**deleted, "object": "response"})  # OpenAI's answer: {"id", "object": "response", "deleted"}
    response = await conversations.get(rid, owner=owner)
    return JSON(OpenAIView.of_response(response).response(response))


async def input_items(request: Request) -> Response:
    """The stored turn's own input items, in OpenAI's list shape (`order`, `after`, `limit`)."""
    conversations, rid, owner = _conversations(request), request.path_params["response_id"], caller_of(request).owner
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
    limit_text = query.get("limit", "20")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_INPUT_ITEMS_PAGE:
        raise InvalidRequest(f"'limit' must be a whole number from 1 to {MAX_INPUT_ITEMS_PAGE}.", param="limit")
    response = await conversations.get(rid, owner=owner)
    items = OpenAIView.of_response(response).input_items(await conversations.input_items(rid, owner=owner), rid)
    return JSON(page(items, order=order, after=query.get("after") or None, limit=int(limit_text)))


# Under /v1, each with the scope each method needs (the same as /lmsp/v1's).
RESPONSE_ROUTES = [
    Scoped("/responses", create_response, POST="responses:create"),
    Scoped("/responses/{response_id}/input_items", input_items, GET="responses:read"),
    Scoped("/responses/{response_id}", stored_response, GET="responses:read", DELETE="responses:create"),
]
