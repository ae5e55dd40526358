"""The SSE response itself, over a real socket: keep-alive comments, no buffering, failure → error event."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route
from support import SSE, iter_sse, wait_until

from lmsp_tray.http.sse import EventStream
from lmsp_tray.protocol.events import Event


async def slow_source(gaps: list[float], fail: bool = False) -> AsyncIterator[Event]:
    for i, gap in enumerate(gaps, start=1):
        await asyncio.sleep(gap)
        yield Event(i, "tick", {"n": i})
    if fail:
        raise RuntimeError("boom inside the generator")
    yield Event(len(gaps) + 1, "response.completed", {"status": "completed"})


@pytest.fixture
def server():
    async def ticks(request):
        fail = request.query_params.get("fail") == "1"
        return EventStream(slow_source([0.0, 0.45, 0.0], fail), keepalive=0.1)

    app = Starlette(routes=[Route("/ticks", ticks)])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, 30, "uvicorn to start", interval=0.01)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def test_keepalive_comments_while_silent_and_events_at_once(server: str) -> None:
    arrivals: list[tuple[float, object]] = []
    with httpx.Client(timeout=10) as c, c.stream("GET", f"{server}/ticks") as r:
        start = time.monotonic()
        for item in iter_sse(r):
            arrivals.append((time.monotonic() - start, item))
    comments = [item for _, item in arrivals if isinstance(item, str)]
    evs = [item for _, item in arrivals if isinstance(item, SSE)]
    assert comments and all(c == ": keep-alive" for c in comments)  # no id on comments
    assert [e.id for e in evs] == [1, 2, 3, 4]
    assert evs[-1].event == "response.completed"
    first_tick = next(t for t, item in arrivals if isinstance(item, SSE))
    assert first_tick < 0.3  # sent as soon as produced, not held back


def test_failure_inside_a_stream_ends_with_an_error_event(server: str) -> None:
    with httpx.Client(timeout=10) as c, c.stream("GET", f"{server}/ticks?fail=1") as r:
        evs = [e for e in iter_sse(r) if isinstance(e, SSE)]
    assert evs[-1].event == "error"
    assert evs[-1].id == evs[-2].id + 1
    problem = evs[-1].data["error"]
    assert problem["code"] == "internal_error" and "boom" not in str(problem)
