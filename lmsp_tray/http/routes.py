"""The LMSP endpoints: thin handlers that parse, call the service, and shape the answer.

Each route is `api.Scoped`: it names the scope each of its methods needs. A body over
`INLINE_BODY_BYTES` is decoded and validated on a worker thread (`read_parsed`), one of
`PROCESS_BODY_BYTES` or more in the worker process (`body_parser`), so a request of megabytes never
holds up the other streams, neither on the event loop nor on the interpreter lock. `answer_run` starts a
run and answers it (replay, event stream or finished object) for `/lmsp/v1` and, in OpenAI's words
(`Answer`), for `/v1`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lmsp_tray.errors import PayloadTooLarge
from lmsp_tray.http import wire_json
from lmsp_tray.http.api import PUBLIC, Scoped
from lmsp_tray.http.body_parser import PROCESS_BODY_BYTES, BodyParser
from lmsp_tray.http.security import KEYLESS, keyless_of, token_of
from lmsp_tray.http.sse import KEEPALIVE, EventStream, encode_event, unless_client_leaves
from lmsp_tray.protocol import strict_json
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.requests import ResponseRequest, parse_response_create
from lmsp_tray.serving.replay import ANONYMOUS, Caller, iterate
from lmsp_tray.serving.responder import Replayed, Responder
from lmsp_tray.serving.service import Service

MAX_JSON_DEPTH = strict_json.MAX_JSON_DEPTH
INLINE_BODY_BYTES = 64 * 1024  # a larger body is decoded and validated on a worker thread
SERIAL_BODY_BYTES = 1024 * 1024  # bodies this large are decoded one at a time (`off_loop`)

T = TypeVar("T")


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return wire_json.dumpb(content)


def _service(request: Request) -> Service:
    return request.app.state.service


def caller_of(request: Request) -> Caller:
    """Who is asking: the token the security middleware authorized (`security.token_of`).

    Idempotency keys are scoped to its id, and the responses and tasks it creates are owned by it
    (another token gets 404 for them). Without a token (no security layer in front): "anonymous",
    no owner. A request let in by `keyless_scopes` runs as "keyless": its keys and the responses and
    tasks it creates are its own (no token sees them; every keyless app shares them). This is the one
    place to change that policy.
    """
    token = token_of(request)
    if token is None:
        return Caller(scope=KEYLESS, owner=KEYLESS) if keyless_of(request) else ANONYMOUS
    token_id = token if isinstance(token, str) else str(token.id)
    return Caller(scope=token_id, owner=token_id)


def idempotency_key(request: Request) -> str | None:
    return request.headers.get("idempotency-key")


REPLAYED = {"Idempotent-Replayed": "true"}


def keepalive(request: Request) -> float:
    """How long an event stream may stay silent before a keep-alive comment (`sse_keepalive`)."""
    return _service(request).config.sse_keepalive


async def read_body(request: Request) -> bytes:
    """The request body, refusing an oversized one while reading (before it has all arrived)."""
    limit = _service(request).config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


async def off_loop(fn: Callable[[bytes], T], raw: bytes, request: Request | None = None) -> T:
    """``fn(raw)``: on the event loop for a small body, on a worker thread for a large one.

    Bodies of `SERIAL_BODY_BYTES` or more take turns (`app.state.large_bodies`): their work holds
    the GIL, so parallel threads finish no sooner, while each more of them is one more thread the
    event loop waits behind for the GIL (8 MiB bodies from 8 clients at once held it up to 0.5 s)."""
    if len(raw) <= INLINE_BODY_BYTES:
        return fn(raw)
    gate = getattr(request.app.state, "large_bodies", None) if request is not None else None
    if gate is None or len(raw) < SERIAL_BODY_BYTES:
        return await asyncio.to_thread(fn, raw)
    async with gate:
        return await asyncio.to_thread(fn, raw)


async def read_json(request: Request) -> Any:
    """The request body as JSON (`decode_json`), decoded off the event loop when it is large."""
    return await off_loop(decode_json, await read_body(request), request)


async def read_parsed(request: Request, parse: Callable[[Any], T]) -> T:
    """The body as JSON, validated by `parse` (a module-level function): both off the event loop when the
    body is large, and in the worker process (`app.state.bodies`) from `PROCESS_BODY_BYTES` on, stepping
    aside while a model decodes."""
    raw = await read_body(request)
    if len(raw) >= PROCESS_BODY_BYTES:
        bodies: BodyParser = request.app.state.bodies
        return await bodies.parse(parse, raw, background=_service(request).decoding())
    return await off_loop(lambda raw: parse(decode_json(raw)), raw, request)


async def read_response_create(request: Request) -> ResponseRequest:
    """The body of `POST /responses` or `/tasks`, decoded and validated off the event loop when it is large."""
    return await read_parsed(request, parse_response_create)


def decode_json(raw: bytes) -> Any:
    """A body as JSON (`strict_json.loads`): UTF-8, RFC 8259 only (no NaN, no overflowing or
    endless numbers), no lone surrogates, nested at most `MAX_JSON_DEPTH` levels; a 400 names the field."""
    return strict_json.loads(raw)


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Answer:
    """How an API words a run's answer (`answer_run`): LMSP's as the run has it (`LMSP_ANSWER`), `/v1`'s
    re-spelled as OpenAI's objects and stream chunks."""

    final: Callable[[dict[str, Any]], Any] = _same  # the finished (or replayed) response object
    live: Callable[[AsyncIterator[Event]], AsyncIterator[Event]] = _same  # the events of a run streaming now
    replayed: Callable[[list[Event]], AsyncIterator[Event]] = iterate  # the stored events of a replayed stream
    encode: Callable[[Event], bytes] = encode_event  # one event on the wire
    trailer: bytes = b""  # after the last event of a stream that ended normally
    ping: bytes = KEEPALIVE  # written when the stream has been silent `sse_keepalive` seconds


LMSP_ANSWER = Answer()


async def answer_run(request: Request, parsed: ResponseRequest, answer: Answer) -> Response | EventStream:
    """Start `parsed` through the responder (the caller's `Idempotency-Key`: a replay is sent again as it was,
    marked `Idempotent-Replayed`), then answer with its event stream, cancelled if the client leaves, or with
    the finished object once it is done; a client whose connection drops first cancels the run at once."""
    responder: Responder = request.app.state.responder
    run = await responder.start(parsed, caller=caller_of(request), key=idempotency_key(request))

    def stream(events: AsyncIterator[Event], **kwargs: Any) -> EventStream:
        return EventStream(
            events,
            encode=answer.encode,
            trailer=answer.trailer,
            ping=answer.ping,
            keepalive=keepalive(request),
            **kwargs,
        )

    if isinstance(run, Replayed):
        if run.events is not None:
            return stream(answer.replayed(run.events), headers=REPLAYED)
        body = answer.final(run.body) if run.body is not None else None
        return JSON(body, status_code=run.status, headers=REPLAYED)
    if parsed.stream:
        return stream(answer.live(run.events()), on_disconnect=run.cancel)
    return JSON(answer.final(await unless_client_leaves(request.receive, run.result(), run.cancel)))


async def service_document(request: Request) -> Response:
    return JSON(_service(request).service_document())


def sees_paths(request: Request) -> bool:
    """Whether the caller may see where model files are (the user's home folder and name are in the
    paths): only a token with `models:manage` (the console's, the owner's); any other app gets the
    file name alone."""
    return "models:manage" in getattr(token_of(request), "scopes", ())


def file_names_only(request: Request, model: dict[str, Any]) -> dict[str, Any]:
    """`model` (a model object or an incomplete file) with its full path replaced by the file name,
    unless the caller `sees_paths`."""
    if sees_paths(request):
        return model
    if "path" in model:  # an incomplete file
        return {**model, "path": Path(str(model["path"])).name}
    ext = model.get("extensions", {}).get("lmsp_tray")
    if not ext or "path" not in ext:
        return model
    return {**model, "extensions": {**model["extensions"], "lmsp_tray": {**ext, "path": Path(ext["path"]).name}}}


async def list_models(request: Request) -> Response:
    service = _service(request)
    listing: dict[str, Any] = {"object": "list", "data": [file_names_only(request, m) for m in service.list_models()]}
    ext: dict[str, Any] = {"disk_bytes": service.disk_bytes()}  # this service's extension
    incomplete = [file_names_only(request, f) for f in service.incomplete_files()]
    if incomplete:  # files that are not models yet, apart from the list
        ext["incomplete_files"] = incomplete
    listing["extensions"] = {"lmsp_tray": ext}
    return JSON(listing)


async def get_model(request: Request) -> Response:
    return JSON(file_names_only(request, _service(request).get_model(request.path_params["model_id"])))


async def load_model(request: Request) -> Response:
    return JSON(file_names_only(request, await _service(request).load_model(request.path_params["model_id"])))


async def unload_model(request: Request) -> Response:
    return JSON(file_names_only(request, await _service(request).unload_model(request.path_params["model_id"])))


async def create_response(request: Request) -> Response | EventStream:
    return await answer_run(request, await read_response_create(request), LMSP_ANSWER)


# Under /lmsp/v1, each with the scope each method needs.
ROUTES = [
    Scoped("/", service_document, GET=PUBLIC),
    Scoped("/models", list_models, GET="models:read"),
    Scoped("/models/{model_id:path}/load", load_model, POST="models:manage"),
    Scoped("/models/{model_id:path}/unload", unload_model, POST="models:manage"),
    # GET /models/{model_id}: `model_routes.MODEL_ROUTES`, with DELETE on the same route
    Scoped("/responses", create_response, POST="responses:create"),
]
