"""`Idempotency-Key` on `POST /lmsp/v1/models/pull`, and `lmsp-tray pull` retrying through it.

On a hub_daemon daemon against the fake Hub, over real HTTP: a retry with the same
key gets the same task and never a second one; another body is a reuse (422);
a retry while the first is still being planned is 409; another token's key is
another key. The command's retry goes through a loopback proxy that swallows
the answer to its first `POST` (the service made the task, the command never
heard), the case the key exists for.
"""

from __future__ import annotations

import argparse
import socket
import threading
import uuid

import httpx
import pytest
from hub_server import FakeHub
from hub_support import TINY, c, fake_hub, hf_env, home, hub, hub_daemon, wait_for_progress  # noqa: F401
from support import LiveDaemon, wait_task, wait_until

pytestmark = pytest.mark.timeout(300)

Q5 = "Tiny-Q5_K_M.gguf"
BODY = {"model": f"{TINY}:Q5_K_M", "include_mmproj": False}


def key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def download_tasks(c: httpx.Client) -> list[dict]:
    return [t for t in c.get("/tasks").json()["data"] if t["kind"] == "model.download"]


def test_a_retry_with_the_key_gets_the_same_task_and_no_second_download(c: httpx.Client, hub: FakeHub) -> None:
    pause = hub.pause(f"{TINY}/{Q5}", 300_000)
    k = key()
    first = c.post("/models/pull", json=BODY, headers=k)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    assert pause.reached.wait(60)
    wait_for_progress(c, first.json()["id"], 300_000)
    # While it downloads: the same task, as it is now (running), not a second one.
    again = c.post("/models/pull", json={"include_mmproj": False, "model": f"{TINY}:Q5_K_M"}, headers=k)  # key order
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.headers["location"] == first.headers["location"]
    assert again.json()["status"] == "in_progress" and again.json()["download"]["model"] == f"hf.co/{TINY}:Q5_K_M"
    # The same key with another body is a mistake, not a replay.
    other = c.post("/models/pull", json={"model": f"{TINY}:Q4_K_M", "include_mmproj": False}, headers=k)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    assert other.json()["param"] == "Idempotency-Key"
    pause.release.set()
    assert wait_task(c, first.json()["id"], {"completed", "failed"})["status"] == "completed"
    late = c.post("/models/pull", json=BODY, headers=k)  # after the end: the finished task
    assert late.headers["idempotent-replayed"] == "true" and late.json()["status"] == "completed"
    assert [t["id"] for t in download_tasks(c)] == [first.json()["id"]]
    assert hub.downloaded[f"{TINY}/{Q5}"] == len(hub.repos[TINY].files[Q5])
    # Without a key every POST is a pull of its own.
    assert c.post("/models/pull", json=BODY).json()["id"] != first.json()["id"]
    assert len(download_tasks(c)) == 2


def test_the_same_key_from_another_token_is_another_key(c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub) -> None:
    other_app = hub_daemon.daemon.auth.tokens.create("other", ["models:manage", "tasks:read"]).secret
    other = {"Authorization": f"Bearer {other_app}"}
    k = key()
    mine = c.post("/models/pull", json=BODY, headers=k)
    theirs = c.post("/models/pull", json=BODY, headers={**k, **other})
    assert theirs.status_code == 202 and "idempotent-replayed" not in theirs.headers
    assert theirs.json()["id"] != mine.json()["id"]
    r = c.post("/models/pull", json={"model": f"{TINY}:Q4_K_M", "include_mmproj": False}, headers={**k, **other})
    assert r.status_code == 422  # in their scope the key now holds their first body
    again = c.post("/models/pull", json=BODY, headers=k)
    assert again.headers["idempotent-replayed"] == "true" and again.json()["id"] == mine.json()["id"]
    with httpx.Client(base_url=hub_daemon.url, timeout=60, headers=other) as them:
        replay = them.post("/models/pull", json=BODY, headers=k)
        assert replay.headers["idempotent-replayed"] == "true" and replay.json()["id"] == theirs.json()["id"]
        assert them.get(f"/tasks/{mine.json()['id']}").status_code == 404  # each sees only its own
        assert wait_task(them, theirs.json()["id"], {"completed", "failed"})["status"] == "completed"
    assert wait_task(c, mine.json()["id"], {"completed", "failed"})["status"] == "completed"


def test_a_retry_while_the_first_is_planned_is_409_and_a_failed_pull_frees_the_key(
    c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub
) -> None:
    downloads = hub_daemon.daemon.downloads
    planning, go_on = threading.Event(), threading.Event()
    plan = downloads.puller.plan

    def slow_plan(*args, **kwargs):  # a slow Hub, on the thread the service plans on
        planning.set()
        assert go_on.wait(60)
        return plan(*args, **kwargs)

    downloads.puller.plan = slow_plan
    k = key()
    answers: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answers.append(c.post("/models/pull", json=BODY, headers=k)))
    first.start()
    try:
        assert planning.wait(60)
        r = c.post("/models/pull", json=BODY, headers=k)
        assert r.status_code == 409 and r.json()["code"] == "idempotency_key_in_progress"
    finally:
        go_on.set()
        first.join(60)
    downloads.puller.plan = plan
    assert answers[0].status_code == 202, answers[0].text
    again = c.post("/models/pull", json=BODY, headers=k)
    assert again.headers["idempotent-replayed"] == "true" and again.json()["id"] == answers[0].json()["id"]
    # A pull refused before its task exists keeps nothing: the retry is planned again (and refused again).
    k = key()
    for _ in range(2):
        r = c.post("/models/pull", json={"model": "test-org/Missing-GGUF"}, headers=k)
        assert r.status_code == 404 and r.json()["code"] == "repository_not_found"
    r = c.post("/models/pull", json=BODY, headers={"Idempotency-Key": "caf\u00e9".encode()})  # type: ignore[dict-item]
    assert r.status_code == 400 and r.json()["param"] == "Idempotency-Key"
    wait_task(c, answers[0].json()["id"], {"completed", "failed"})


class SwallowFirstPull:
    """A loopback proxy to the service that forwards the first `POST /models/pull` and then closes the
    client's connection without its answer; every other request goes through untouched.

    Each request is one connection (urllib sends ``Connection: close``), so forwarding the request and
    copying the service's bytes back until it closes is the whole job."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split("/", 1)[0].split(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/lmsp/v1"
        self.pulls: list[tuple[bytes, bytes]] = []  # (request head, answer head) of each POST /models/pull
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as up:
            head, body = _read_request(client)
            up.sendall(head + body)
            if not head.startswith(b"POST /lmsp/v1/models/pull "):
                while chunk := up.recv(65536):
                    client.sendall(chunk)
                return
            answer = b""
            while chunk := up.recv(65536):
                answer += chunk
            with self._lock:
                self.pulls.append((head, answer.split(b"\r\n\r\n", 1)[0]))
                swallow = len(self.pulls) == 1
            if not swallow:
                client.sendall(answer)


def _read_request(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n", body


def _header(head: bytes, name: str) -> str | None:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        key_, _, value = line.partition(":")
        if key_.strip().lower() == name.lower():
            return value.strip()
    return None


def test_the_command_retries_a_lost_answer_with_its_key_and_gets_the_same_task(
    c: httpx.Client, hub_daemon: LiveDaemon, hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmsp_tray.cli.pull_remote import pull_through_service

    proxy = SwallowFirstPull(hub_daemon.url)
    try:
        args = argparse.Namespace(model=f"{TINY}:Q5_K_M", no_mmproj=True)
        assert pull_through_service(proxy.url, hub_daemon.owner_token, args) == 0
    finally:
        proxy.close()
    out = capsys.readouterr()
    assert out.out.strip() == "tiny-hub:1m-q5_k_m" and "Traceback" not in out.err
    (first, first_answer), (retry, retry_answer) = proxy.pulls
    sent = _header(first, "Idempotency-Key")
    assert sent and _header(retry, "Idempotency-Key") == sent  # one fresh key, sent twice
    assert first_answer.startswith(b"HTTP/1.1 202") and _header(first_answer, "Idempotent-Replayed") is None
    assert retry_answer.startswith(b"HTTP/1.1 202") and _header(retry_answer, "Idempotent-Replayed") == "true"
    tasks = download_tasks(c)
    assert len(tasks) == 1 and f"(task {tasks[0]['id']})" in out.err and tasks[0]["status"] == "completed"
    assert hub.downloaded[f"{TINY}/{Q5}"] == len(hub.repos[TINY].files[Q5])
    # A second run is a pull of its own: a fresh key.
    proxy = SwallowFirstPull(hub_daemon.url)
    try:
        assert pull_through_service(proxy.url, hub_daemon.owner_token, args) == 0
    finally:
        proxy.close()
    assert _header(proxy.pulls[0][0], "Idempotency-Key") != sent
    wait_until(lambda: len(download_tasks(c)) == 2, 10, "the second run's task")
