"""Endpoints over what the store keeps: stored responses (`conversations`) and tasks (PROFILE §4).

Thin handlers, like `routes`: parse, call `Conversations` / `TaskManager`,
shape the answer. A task's event stream raises its 404 / 410 before the
first byte, and a reader that disconnects only stops reading (the task goes
on; cancelling is `POST /tasks/{id}/cancel`).
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import InvalidRequest, ServiceUnavailable
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, REPLAYED, caller_of, idempotency_key, keepalive, read_response_create
from lmsp_tray.http.sse import EventStream
from lmsp_tray.serving.conversations import Conversations
from lmsp_tray.serving.tasks import TaskManager, task_object

BASE = "/lmsp/v1"


def _conversations(request: Request) -> Conversations:
    conversations = request.app.state.conversations
    if conversations is None:
        raise ServiceUnavailable("This service runs without its store; stored responses are not available.")
    return conversations


def _tasks(request: Request) -> TaskManager:
    tasks = request.app.state.tasks
    if tasks is None:
        raise ServiceUnavailable("This service runs without its store; tasks are not available.")
    return tasks


async def stored_response(request: Request) -> Response:
    """GET returns a stored response, DELETE removes it; unknown: 404 response_not_found."""
    conversations, rid, owner = _conversations(request), request.path_params["response_id"], caller_of(request).owner
    if request.method == "DELETE":
        return JSON(await conversations.delete(rid, owner=owner))
    return JSON(await conversations.get(rid, owner=owner))


async def tasks(request: Request) -> Response:
    return await (create_task(request) if request.method == "POST" else list_tasks(request))


async def create_task(request: Request) -> Response:
    parsed = await read_response_create(request)
    task, replayed = await _tasks(request).create(parsed, caller=caller_of(request), key=idempotency_key(request))
    headers = {"Location": f"{BASE}/tasks/{task.id}", **(REPLAYED if replayed else {})}
    return JSON(task_object(task), status_code=202, headers=headers)


async def get_task(request: Request) -> Response:
    task = await _tasks(request).get(request.path_params["task_id"], caller=caller_of(request))
    return JSON(task_object(task))


async def cancel_task(request: Request) -> Response:
    task = await _tasks(request).cancel(request.path_params["task_id"], caller=caller_of(request))
    return JSON(task_object(task))


async def list_tasks(request: Request) -> Response:
    query = request.query_params
    statuses = [s for value in query.getlist("status") for s in value.split(",")]  # '' is an unknown status
    limit = _int(query.get("limit", "20"), "limit")
    page = await _tasks(request).list_tasks(
        caller=caller_of(request), status=statuses, limit=limit, after=query.get("after") or None
    )
    data = [task_object(t) for t in page.items]
    return JSON(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": page.last_id,
            "has_more": page.has_more,
        }
    )


async def task_events(request: Request) -> EventStream:
    after = resume_point(request)
    events = await _tasks(request).open_events(request.path_params["task_id"], after, caller=caller_of(request))
    return EventStream(events, keepalive=keepalive(request))


def resume_point(request: Request) -> int:
    """Where a reader resumes: `?after=N` if given (it wins), else `Last-Event-ID: N`, else 0."""
    after = request.query_params.get("after")
    if after is not None:
        return _int(after, "after")
    last = request.headers.get("last-event-id")
    if last is not None and last.strip():
        return _int(last, "Last-Event-ID")
    return 0


MAX_INT = 2**53 - 1


def _int(value: str, param: str) -> int:
    text = value.strip()
    if not re.fullmatch(r"[0-9]{1,16}", text) or int(text) > MAX_INT:
        raise InvalidRequest(f"'{param}' must be a whole number from 0 to {MAX_INT}, got {value[:40]!r}.", param=param)
    return int(text)


# Under /lmsp/v1, each with the scope each method needs.
STORED_ROUTES = [
    Scoped(
        "/responses/{response_id}", stored_response, GET="responses:read", DELETE="responses:create"
    ),  # removing is writing
    Scoped("/tasks", tasks, GET="tasks:read", POST="tasks:create"),
    Scoped("/tasks/{task_id}", get_task, GET="tasks:read"),
    Scoped("/tasks/{task_id}/events", task_events, GET="tasks:read"),
    Scoped("/tasks/{task_id}/cancel", cancel_task, POST="tasks:create"),
]
