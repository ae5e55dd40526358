"""Floods by one local process (issue 15 item 10): a token's queued tasks are capped (429 with
Retry-After), other tokens are not held up by it, and a pairing flood locks out no real app and is
dismissed in one action."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
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


def ask(live: LiveDaemon, name: str) -> httpx.Response:
    return httpx.post(live.url + "/auth/pairings", json={"app_name": name, "scopes": ["models:read"]}, timeout=30)


def test_a_pairing_flood_under_one_name_locks_out_no_real_app(daemon: LiveDaemon, client: httpx.Client) -> None:
    real = ask(daemon, "Real App")
    assert real.status_code == 202
    flood = [ask(daemon, "Flood") for _ in range(40)]
    refused = [r for r in flood if r.status_code == 429]
    assert len(refused) == 35 and all(1 <= int(r.headers["retry-after"]) <= 61 for r in refused)
    pending = client.get("/auth/pairings").json()["data"]
    assert [p["app_name"] for p in pending].count("Flood") <= 2  # its newest supersede its oldest
    assert "Real App" in [p["app_name"] for p in pending]
    again = ask(daemon, "Another Real App")  # a real app asking now is heard at once
    assert again.status_code == 202


def test_a_pairing_flood_of_many_names_refuses_no_one(daemon: LiveDaemon, client: httpx.Client) -> None:
    limits = daemon.daemon.auth.pairings.limits
    answers = [ask(daemon, f"Flood {i}") for i in range(60)]
    assert {r.status_code for r in answers} == {202}
    r = ask(daemon, "Real App")
    assert r.status_code == 202
    pending = client.get("/auth/pairings").json()["data"]
    assert len(pending) == limits.max_pending and pending[-1]["app_name"] == "Real App"
    # The displaced ones are told so when they poll (and may ask again).
    first = answers[0].json()
    polled = httpx.get(
        daemon.url + f"/auth/pairings/{first['id']}",
        headers={"Authorization": f"Bearer {first['poll_token']}"},
        timeout=30,
    )
    assert polled.json()["status"] == "expired"


def test_a_flood_is_dismissed_in_one_action(daemon: LiveDaemon, client: httpx.Client) -> None:
    for i in range(12):
        assert ask(daemon, f"Flood {i}").status_code == 202
    r = client.post("/auth/pairings/dismiss")
    assert r.status_code == 200 and len(r.json()["data"]) == 12
    assert all(p["status"] == "denied" for p in r.json()["data"])
    assert client.get("/auth/pairings").json()["data"] == []
    assert client.post("/auth/pairings/dismiss").json()["data"] == []  # nothing left: an empty list
    assert httpx.post(daemon.url + "/auth/pairings/dismiss", timeout=30).status_code == 401  # the person's only


def test_the_tray_offers_to_deny_them_all(daemon: LiveDaemon) -> None:
    from lmsp_tray.desktop.backend import tray_hooks
    from lmsp_tray.desktop.menu import ALL_PAIRINGS, Action, PairingView, TrayState, build_menu, find_item

    views = tuple(PairingView(f"pair_{i}", f"Flood {i}", ("models:read",), "BCDF-GHJK") for i in range(3))
    item = find_item(build_menu(TrayState(pairings=views)), "Deny all")
    assert item.text == "Deny all 3 requests" and (item.action, item.arg) == (Action.DENY_PAIRING, ALL_PAIRINGS)
    assert not any(i.text.startswith("Deny all") for i in build_menu(TrayState(pairings=views[:1])))
    for i in range(3):
        ask(daemon, f"Flood {i}")
    tray_hooks(daemon.daemon).deny_all_pairings()  # what the item does (backend.deny_pairing("*"))
    assert daemon.daemon.auth.pairings.pending_pairings() == []


def _count_decoding(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make each body's decoding take 50 ms; the list's one number: the most decoded at once so far."""
    from lmsp_tray.http import routes

    active, most = [0], [0]
    lock = threading.Lock()
    real = routes.decode_json

    def decode(raw: bytes) -> object:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.05)
            return real(raw)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(routes, "decode_json", decode)
    return most


def test_large_bodies_are_decoded_one_at_a_time(
    daemon: LiveDaemon, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoded on threads (here below the worker process's threshold), their decoding holds the GIL: side by
    side they would finish no sooner, only hold the loop longer."""
    from lmsp_tray.http import routes

    monkeypatch.setattr(routes, "PROCESS_BODY_BYTES", 2**62)  # the thread path (test_body_parser: the worker)
    most = _count_decoding(monkeypatch)
    big = {"model": "nope", "input": "x" * (routes.SERIAL_BODY_BYTES + 10)}
    small = {"model": "nope", "input": "x" * (routes.INLINE_BODY_BYTES + 10)}
    with ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda b: client.post("/responses", json=b).status_code, [big] * 6))
    assert codes == [404] * 6 and most[0] == 1
    most[0] = 0
    with ThreadPoolExecutor(6) as pool:  # below the threshold they need not wait for each other
        list(pool.map(lambda b: client.post("/responses", json=b).status_code, [small] * 6))
    assert most[0] >= 1


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/chat/completions", "messages"), ("/v1/completions", "prompt"), ("/v1/responses", "input")],
)
def test_large_v1_bodies_are_decoded_one_at_a_time_too(
    daemon: LiveDaemon, monkeypatch: pytest.MonkeyPatch, path: str, field: str
) -> None:
    from lmsp_tray.http import routes

    monkeypatch.setattr(routes, "PROCESS_BODY_BYTES", 2**62)  # the thread path (test_body_parser: the worker)
    most = _count_decoding(monkeypatch)
    text = "x" * (routes.SERIAL_BODY_BYTES + 10)
    value: object = [{"role": "user", "content": text}] if field == "messages" else text
    body = {"model": "nope", field: value}
    with (
        httpx.Client(base_url=daemon.base, headers=daemon.auth_headers, timeout=60) as c,
        ThreadPoolExecutor(4) as pool,
    ):
        codes = list(pool.map(lambda _: c.post(path, json=body).status_code, range(4)))
    assert codes == [404] * 4 and most[0] == 1
