"""Ollama's model management: `POST /api/pull` over the service's own download task; the rest refused clearly.

Why: Ollama's clients pull a model by name before using it (`ollama.pull`, Open
WebUI's model manager). Names Ollama itself accepts for Hugging Face —
`hf.co/<org>/<repo>:<quant>` — start the service's durable download task (the same
as `POST /lmsp/v1/models/pull`: planned and checked for disk space first, resumable,
shown in the tray and the console), and its events are answered as Ollama's
progress lines, or with `stream: false` as one `{"status": "success"}`. A client that
leaves does not stop the download: it is a task, followed and cancelled in the
console. `DELETE /api/delete` deletes what the service owns, as the console does
(`serving.model_removal`), and refuses other apps' files; `/api/create`, `/api/copy`
and `/api/push` are refused, each saying why (scope `models:manage`, as a pull's).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import LMSPError, ServiceUnavailable, UnsupportedCapability
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.ollama.generate import NDJSON, encode_line
from lmsp_tray.http.ollama.models import resolve, service_of
from lmsp_tray.http.routes import JSON, caller_of, read_json
from lmsp_tray.http.sse import EventStream
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.ollama_pull import SUCCESS, PullLines
from lmsp_tray.protocol.ollama_requests import parse_model_name
from lmsp_tray.serving.downloads import DownloadTasks


def _downloads(request: Request) -> DownloadTasks:
    downloads = getattr(request.app.state, "downloads", None)
    if downloads is None:
        raise ServiceUnavailable("This service runs without its store; downloads are not available.")
    return downloads


async def _pull_lines(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    writer = PullLines()
    seq = 0
    async for event in events:
        for line in writer.feed(event.name, event.data):
            seq += 1
            ended = "error" in line or line.get("status") == SUCCESS
            yield Event(seq, event.name if ended else "line", line)
        if event.terminal or event.name == "model.download.paused":
            return


def _failure(line: dict[str, Any], problem: Any) -> LMSPError:
    error = LMSPError(str(line["error"]))
    error.status = int((problem or {}).get("status") or 500) if isinstance(problem, dict) else 500
    return error


async def pull(request: Request) -> Response | EventStream:
    body = await read_json(request)
    name = parse_model_name(body)
    stream = not (isinstance(body, dict) and body.get("stream") is False)
    downloads = _downloads(request)
    task, _ = await downloads.create({"model": name}, caller=caller_of(request))
    events = await downloads.open_events(task, 0)
    if stream:
        return EventStream(_pull_lines(events), encode=encode_line, keepalive=None, media_type=NDJSON)
    writer, problem = PullLines(), None
    last: dict[str, Any] = {}
    async for event in events:
        if event.name == "model.download.failed":
            problem = event.data.get("error")
        last = (writer.feed(event.name, event.data) or [last])[-1]
        if event.terminal or event.name == "model.download.paused":
            break
    if "error" in last:
        raise _failure(last, problem)
    return JSON(last)


async def delete(request: Request) -> Response:
    """`DELETE /api/delete`: as `DELETE /lmsp/v1/models/{id}` — only what the service owns (its own folder, its
    Hugging Face downloads), unloaded first; another app's file is refused (409) saying whose and where."""
    body = await read_json(request)
    entry = resolve(service_of(request), parse_model_name(body))
    remover = getattr(getattr(request.app.state, "model_parts", None), "remover", None)
    if remover is None:
        raise ServiceUnavailable("This service cannot delete models (it runs without its data folder).")
    await asyncio.to_thread(remover.remove, entry)
    return Response(status_code=200)


async def create(_request: Request) -> Response:
    raise UnsupportedCapability(
        "Creating models is not supported: lmsp-tray runs GGUF files as they are and does not build models from "
        "Modelfiles. Put a GGUF file in one of its model folders, or download one with POST /api/pull "
        "(hf.co/<org>/<repo>:<quant>)."
    )


async def copy(_request: Request) -> Response:
    raise UnsupportedCapability(
        "Copying models is not supported: lmsp-tray names each model after its file and keeps no copies under "
        "other names."
    )


async def push(_request: Request) -> Response:
    raise UnsupportedCapability(
        "Pushing models is not supported: lmsp-tray does not publish models to a registry; it downloads from "
        "Hugging Face only."
    )


ROUTES = [
    Scoped("/api/pull", pull, POST="models:manage"),
    Scoped("/api/delete", delete, DELETE="models:manage"),
    Scoped("/api/create", create, POST="models:manage"),
    Scoped("/api/copy", copy, POST="models:manage"),
    Scoped("/api/push", push, POST="models:manage"),
]
