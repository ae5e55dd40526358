"""`POST /v1/audio/transcriptions`: OpenAI's multipart form, run as a chat turn on a model that takes audio.

Why here: a thin handler, like `chat.py` — read the body within `max_request_bytes` (as every body),
parse the multipart form from it (Starlette's parser, python-multipart: one file, a few short fields),
build the chat request (`protocol.openai_audio`), run it through the responder (the same scheduler,
limits and errors as chat) and answer OpenAI's transcription object, or the bare text for
`response_format=text`. A client that leaves cancels its run. Scope: `responses:create`, the scope
that already lets an app generate.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, caller_of, read_body
from lmsp_tray.http.sse import unless_client_leaves
from lmsp_tray.protocol.openai_audio import FIELDS, parse_transcription, transcription_object
from lmsp_tray.serving.responder import Replayed, Responder

MAX_FIELD_BYTES = 64 * 1024  # a prompt or a language is short


async def _once(raw: bytes) -> AsyncGenerator[bytes, None]:
    yield raw


async def read_form(request: Request) -> tuple[dict[str, str], bytes | None, str]:
    """The form's text fields, the `file` part's bytes (None when absent) and its file name."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("Send the audio as multipart/form-data, with the audio as the 'file' part.")
    raw = await read_body(request)
    parser = MultiPartParser(request.headers, _once(raw), max_files=1, max_fields=len(FIELDS) + 8,
                             max_part_size=MAX_FIELD_BYTES)  # fmt: skip
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"The multipart form could not be read: {exc.message}") from None
    try:
        fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
        upload = form.get("file")
        if isinstance(upload, UploadFile):
            return fields, await upload.read(), upload.filename or ""
        return fields, None, ""
    finally:
        await form.close()


async def create_transcription(request: Request) -> Response:
    fields, audio, filename = await read_form(request)
    job = parse_transcription(fields, audio, filename)
    responder: Responder = request.app.state.responder
    run = await responder.start(job.request, caller=caller_of(request))
    if isinstance(run, Replayed):  # only with an idempotency key, which this route does not pass
        raise InvalidRequest("A transcription cannot be replayed.")
    response = await unless_client_leaves(request.receive, run.result(), run.cancel)
    answer = transcription_object(response)
    if job.response_format == "text":
        return PlainTextResponse(answer["text"])
    return JSON(answer)


AUDIO_ROUTES = [Scoped("/audio/transcriptions", create_transcription, POST="responses:create")]
