"""Floods by one local process (issue 15 item 10): a token's queued tasks are capped (429 with
Retry-After), other tokens are not held up by it, and a pairing flood locks out no real app and is
dismissed in one action."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from support import SLOW_ID, LiveDaemon

SLOW_TASK = {"model": SLOW_ID, "input": "x", "max_output_tokens": 2000}


def test_a_tokens_queued_tasks_are_capped(daemon_factory: Callable[..., LiveDaemon]) -> None:
    live = daemon_factory(max_queued_tasks=5, parallel=1)
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=60) as c:
        with ThreadPoolExecutor(16) as pool:  # 60 at once: the cap holds however they interleave
            answers = list(pool.map(lambda _: c.post("/tasks", json=SLOW_TASK), range(60)))
        accepted = [r for r in answers if r.status_code == 202]
        refused = [r for r in answers if r.status_code == 429]
        assert len(accepted) + len(refused) == 60, {r.status_code for r in answers}
        assert 5 <= len(accepted) <= 5 + 1, len(accepted)  # five waiting, at most one already running
        doc = refused[0].json()
        assert doc["code"] == "too_many_requests" and "max_queued_tasks" in doc["detail"]
        assert int(refused[0].headers["retry-after"]) >= 1

        # Another token is not held up by this one's flood.
        r = c.post("/auth/tokens", json={"name": "other", "scopes": ["tasks:create", "tasks:read"]})
        other = {"Authorization": f"Bearer {r.json()['secret']}"}
        assert c.post("/tasks", json=SLOW_TASK, headers=other).status_code == 202

        # Cancelling a waiting task gives its place back.
        waiting = [r.json()["id"] for r in accepted if c.get(f"/tasks/{r.json()['id']}").json()["status"] == "queued"]
        assert c.post(f"/tasks/{waiting[-1]}/cancel").status_code == 200
        assert c.post("/tasks", json=SLOW_TASK).status_code == 202
        assert c.post("/tasks", json=SLOW_TASK).status_code == 429
        for task in c.get("/tasks", params={"limit": 100}).json()["data"]:
            if task["status"] in ("queued", "in_progress"):
                c.post(f"/tasks/{task['id']}/cancel")
