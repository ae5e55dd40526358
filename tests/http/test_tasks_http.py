"""Tasks over HTTP with real llama.cpp on generated GGUFs: create, follow, resume, cancel, expire, list."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import httpx
import pytest
from support import SLOW_ID, SSE, TINY_ID, MemoryVault, body, iter_sse, wait_task, wait_until

pytestmark = pytest.mark.shared_daemon  # the tests share the module's daemon (conftest.py)

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


def create(c: httpx.Client, **payload) -> dict:
    r = c.post("/tasks", json=payload)
    assert r.status_code == 202, r.text
    doc = r.json()
    assert r.headers["location"] == f"/lmsp/v1/tasks/{doc['id']}"
    return doc


def read(
    c: httpx.Client,
    task_id: str,
    *,
    after: int | None = None,
    last_event_id: int | None = None,
    stop_after: int | None = None,
) -> list[SSE]:
    """Read a task's events; with `stop_after`, cut the connection after that many events."""
    params = {"after": after} if after is not None else None
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else None
    got: list[SSE] = []
    with c.stream("GET", f"/tasks/{task_id}/events", params=params, headers=headers) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for e in iter_sse(r):
            if isinstance(e, SSE):
                got.append(e)
                if stop_after is not None and len(got) >= stop_after:
                    break  # leaving the block closes the connection mid-stream
    return got


def deltas(evs: list[SSE]) -> str:
    return "".join(e.data["delta"] for e in evs if e.event == "response.output_text.delta")


def final_text(response: dict) -> str:
    return "".join(p["text"] for item in response["output"] if item["type"] == "message" for p in item["content"])


def test_task_lifecycle_and_events(client: httpx.Client) -> None:
    doc = create(client, **body("a task", max_output_tokens=12, stream=True))
    assert doc["object"] == "task" and doc["id"].startswith("task_")
    assert doc["status"] in ("queued", "in_progress")
    assert doc["response_id"].startswith("resp_") and doc["response"] is None and doc["error"] is None
    assert set(doc) == {"id", "object", "status", "created_at", "updated_at", "response_id", "response", "error"}
    evs = read(client, doc["id"])
    assert [e.id for e in evs] == list(range(1, len(evs) + 1))
    assert evs[0].event == "response.created" and evs[-1].event in TERMINAL
    assert sum(e.event in TERMINAL for e in evs) == 1
    assert all(e.data["response_id"] == doc["response_id"] and e.data["sequence_number"] == e.id for e in evs)
    done = client.get(f"/tasks/{doc['id']}").json()
    assert done["status"] == evs[-1].data["status"] == "incomplete"
    assert done["response"] == evs[-1].data["response"]
    assert deltas(evs) == final_text(done["response"]) != ""
    # The same events again, from the store.
    again = read(client, doc["id"])
    assert [(e.id, e.event, e.data) for e in again] == [(e.id, e.event, e.data) for e in evs]


def test_resume_after_cutting_the_connection_at_20_points(daemon_factory) -> None:
    live = daemon_factory()
    rng = random.Random(4711)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        task = create(c, **body("Tell a long story.", model=SLOW_ID, max_output_tokens=400))
        seen: list[SSE] = []
        live_cuts = 0
        for cut in range(20):
            last = seen[-1].id if seen else None
            if last is None:
                part = read(c, task["id"], stop_after=rng.randint(1, 25))
            elif cut % 2:
                part = read(c, task["id"], after=last, stop_after=rng.randint(1, 25))
            else:
                part = read(c, task["id"], last_event_id=last, stop_after=rng.randint(1, 25))
            seen += part
            if part and part[-1].event in TERMINAL:
                break
            live_cuts += c.get(f"/tasks/{task['id']}").json()["status"] == "in_progress"
        if seen[-1].event not in TERMINAL:
            seen += read(c, task["id"], after=seen[-1].id)
        ids = [e.id for e in seen]
        assert ids == list(range(1, len(ids) + 1)), "a gap or a duplicate across reconnections"
        assert seen[-1].event in TERMINAL
        assert live_cuts >= 5, "most cuts should happen while the task still runs"
        doc = c.get(f"/tasks/{task['id']}").json()
        assert deltas(seen) == final_text(doc["response"]) == final_text(seen[-1].data["response"])


def test_readers_only_see_committed_events(daemon_factory) -> None:
    """Written, then sent: every event a reader gets is already in the database."""
    from lmsp_tray.store import event_log

    live = daemon_factory()
    db = live.daemon.db
    stop = threading.Event()

    def slow_writer() -> None:  # occupy the writer now and then, so commits lag behind generation
        while not stop.is_set():
            db.write(lambda conn: time.sleep(0.03)).result()
            time.sleep(0.01)

    jammer = threading.Thread(target=slow_writer)
    jammer.start()
    try:
        with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
            task = create(c, **body("committed first", model=SLOW_ID, max_output_tokens=300))
            checked = 0
            with c.stream("GET", f"/tasks/{task['id']}/events") as r:
                for e in iter_sse(r):
                    if isinstance(e, SSE):
                        assert db.read(event_log.last_event_seq, task["id"]) >= e.id, f"event {e.id} not committed"
                        checked += 1
            assert checked > 20
    finally:
        stop.set()
        jammer.join()


def test_after_beats_last_event_id(client: httpx.Client) -> None:
    task = create(client, **body("count", max_output_tokens=10))
    full = read(client, task["id"])
    assert len(full) > 8
    assert [e.id for e in read(client, task["id"], last_event_id=2)] == [e.id for e in full[2:]]
    assert [e.id for e in read(client, task["id"], after=5, last_event_id=2)] == [e.id for e in full[5:]]
    assert read(client, task["id"], after=full[-1].id) == []
    for params, headers, param in (
        ({"after": "x"}, {}, "after"),
        ({"after": "-1"}, {}, "after"),
        ({}, {"Last-Event-ID": "abc"}, "Last-Event-ID"),
    ):
        r = client.get(f"/tasks/{task['id']}/events", params=params, headers=headers)
        assert r.status_code == 400 and r.json()["param"] == param


def test_several_readers_follow_one_task(daemon_factory) -> None:
    live = daemon_factory()
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        task = create(c, **body("many readers", model=SLOW_ID, max_output_tokens=300))
    results: dict[int, list] = {}

    def follow(n: int) -> None:
        with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as own:
            results[n] = [(e.id, e.event, e.data) for e in read(own, task["id"], after=n * 3)]

    threads = [threading.Thread(target=follow, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 4
    full = results[0]
    assert [e[0] for e in full] == list(range(1, len(full) + 1)) and full[-1][1] in TERMINAL
    for n in range(1, 4):
        assert results[n] == full[n * 3 :]


def test_events_expire_after_retention_but_the_task_keeps_its_result(daemon_factory) -> None:
    live = daemon_factory(event_retention=1.0)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        task = create(c, **body("short lived", max_output_tokens=5))
        evs = read(c, task["id"])
        assert evs[-1].event in TERMINAL

        def expired() -> httpx.Response | None:
            r = c.get(f"/tasks/{task['id']}/events")
            assert r.status_code in (200, 410)
            return r if r.status_code == 410 else None

        r = wait_until(expired, 60, "the events to expire", interval=0.2)  # the housekeeper runs every second
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "event_history_expired"
        assert c.get(f"/tasks/{task['id']}/events", params={"after": 2}).status_code == 410
        assert read(c, task["id"], after=evs[-1].id) == []  # nothing missing: nothing to refuse
        doc = c.get(f"/tasks/{task['id']}").json()
        assert doc["status"] == "incomplete" and final_text(doc["response"]) == deltas(evs)
    # The housekeeper deleted the events themselves (in the background): the database stays bounded.
    db = live.daemon.db

    def left(conn: Any) -> int:
        return conn.execute("SELECT COUNT(*) FROM events WHERE owner_id = ?", (task["id"],)).fetchone()[0]

    wait_until(lambda: db.read(left) == 0, 30, "the expired events to be deleted", interval=0.2)


def test_cancel_mid_generation(daemon_factory) -> None:
    live = daemon_factory(parallel=1)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        task = create(c, **body("go on and on", model=SLOW_ID, max_output_tokens=4000))
        got: list[SSE] = []
        with c.stream("GET", f"/tasks/{task['id']}/events") as r:
            for e in iter_sse(r):
                if not isinstance(e, SSE):
                    continue
                got.append(e)
                if len([x for x in got if x.event == "response.output_text.delta"]) == 5:
                    cancelled = c.post(f"/tasks/{task['id']}/cancel")
                    assert cancelled.status_code == 200
                    assert cancelled.json()["status"] == "cancelled"
        assert got[-1].event == "response.cancelled"
        assert [e.id for e in got] == list(range(1, len(got) + 1))
        sched = live.scheduler(SLOW_ID)
        wait_until(lambda: sched.generating == 0, 10, "the generation to stop", interval=0.01)
        steps = sched.steps
        time.sleep(0.3)
        assert sched.generating == 0 and sched.steps == steps
        doc = c.get(f"/tasks/{task['id']}").json()
        assert doc["status"] == "cancelled" and doc["response"]["status"] == "cancelled"
        assert final_text(doc["response"]) == deltas(got)
        # Cancelling a finished task changes nothing.
        again = c.post(f"/tasks/{task['id']}/cancel")
        assert again.status_code == 200 and again.json() == doc


def test_queued_tasks_wait_their_turn_and_can_be_cancelled(daemon_factory) -> None:
    live = daemon_factory(parallel=1)  # one task runs at a time
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        first = create(c, **body("first", model=SLOW_ID, max_output_tokens=4000))
        second = create(c, **body("second", max_output_tokens=4))
        third = create(c, **body("third", max_output_tokens=4))
        wait_task(c, first["id"], {"in_progress"})
        assert c.get(f"/tasks/{second['id']}").json()["status"] == "queued"
        r = c.post(f"/tasks/{second['id']}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        assert [e.event for e in read(c, second["id"])] == ["response.created", "response.cancelled"]
        queued = c.get("/tasks", params={"status": "queued"}).json()["data"]
        assert [t["id"] for t in queued] == [third["id"]]
        c.post(f"/tasks/{first['id']}/cancel").raise_for_status()
        assert wait_task(c, third["id"], {"completed", "incomplete"})["response"]["output"]


def test_list_tasks(client: httpx.Client) -> None:
    made = [create(client, **body(f"list {i}", max_output_tokens=2)) for i in range(3)]
    for t in made:
        wait_task(client, t["id"], {"completed", "incomplete"})
    page = client.get("/tasks").json()
    assert page["object"] == "list"
    ids = [t["id"] for t in page["data"]]
    assert ids[:3] == [t["id"] for t in reversed(made)]  # newest first
    one = client.get("/tasks", params={"limit": 1}).json()
    assert one["has_more"] is True and one["data"][0]["id"] == made[-1]["id"] and one["last_id"] == made[-1]["id"]
    nxt = client.get("/tasks", params={"limit": 1, "after": one["last_id"]}).json()
    assert nxt["data"][0]["id"] == made[-2]["id"]
    assert client.get("/tasks", params={"status": "incomplete,completed"}).json()["data"][0]["id"] == made[-1]["id"]
    assert client.get("/tasks", params={"status": "cancelled"}).json()["data"] == []
    for params in ({"status": "sleeping"}, {"limit": 0}, {"limit": "many"}):
        r = client.get("/tasks", params=params)
        assert r.status_code == 400 and r.json()["code"] == "invalid_request"


def test_unknown_tasks_and_bad_requests(client: httpx.Client) -> None:
    for method, path in (
        ("GET", "/tasks/task_nope"),
        ("GET", "/tasks/task_nope/events"),
        ("POST", "/tasks/task_nope/cancel"),
    ):
        r = client.request(method, path)
        assert r.status_code == 404 and r.json()["code"] == "task_not_found"
    r = client.post("/tasks", json=body("x", model="nope:1b"))
    assert r.status_code == 404 and r.json()["code"] == "model_not_found"
    r = client.post("/tasks", json=body("x", previous_response_id="resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"))
    assert r.status_code == 404 and r.json()["code"] == "response_not_found"
    r = client.post("/tasks", json={"model": TINY_ID})
    assert r.status_code == 400 and r.json()["param"] == "input"


def test_a_task_that_cannot_start_fails_with_its_problem(client: httpx.Client) -> None:
    task = create(client, **body("hello world " * 400))  # longer than the tiny model's window
    evs = read(client, task["id"])
    assert [e.event for e in evs] == ["response.created", "response.failed"]
    assert evs[-1].data["error"]["code"] == "context_length_exceeded"
    doc = client.get(f"/tasks/{task['id']}").json()
    assert doc["status"] == "failed" and doc["error"]["code"] == "context_length_exceeded"


def test_stored_task_response_continues_a_conversation(client: httpx.Client) -> None:
    task = create(client, **body("first turn", max_output_tokens=4, store=True))
    done = wait_task(client, task["id"], {"completed", "incomplete"})
    stored = client.get(f"/responses/{task['response_id']}")
    assert stored.status_code == 200 and stored.json() == done["response"]
    r = client.post(
        "/responses", json=body("second turn", max_output_tokens=4, previous_response_id=task["response_id"])
    )
    assert r.status_code == 200
    assert r.json()["usage"]["input_tokens"] > done["response"]["usage"]["input_tokens"]
    # A task can continue a conversation too.
    follow = create(client, **body("third turn", max_output_tokens=4, previous_response_id=task["response_id"]))
    assert (
        wait_task(client, follow["id"], {"completed", "incomplete"})["response"]["usage"]["input_tokens"]
        > done["response"]["usage"]["input_tokens"]
    )


def test_shutdown_ends_running_tasks_cleanly_and_keeps_queued_ones(daemon_factory) -> None:
    vault = MemoryVault()  # the same owner token across the restart (the tasks are its own)
    live = daemon_factory(parallel=1, vault=vault)
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        running = create(c, **body("long", model=SLOW_ID, max_output_tokens=4000))
        waiting = create(c, **body("later", max_output_tokens=3))
        wait_task(c, running["id"], {"in_progress"})
        read(c, running["id"], stop_after=4)
    live.stop()
    again = daemon_factory(parallel=1, vault=vault)
    with httpx.Client(base_url=again.url, timeout=60, headers=again.auth_headers) as c:
        doc = c.get(f"/tasks/{running['id']}").json()
        assert doc["status"] == "failed" and doc["error"]["code"] == "service_unavailable"
        evs = read(c, running["id"])
        assert [e.id for e in evs] == list(range(1, len(evs) + 1))
        assert evs[-1].event == "response.failed" and evs[-1].data["error"]["code"] == "service_unavailable"
        assert wait_task(c, waiting["id"], {"completed", "incomplete"})["response"]["output"]
