"""The real process, killed: `lmsp-tray serve` is SIGKILLed mid-task and started again on the same data.

After the restart stored responses and finished tasks are intact, the task
that was running ended `failed` / `service_restarted` with `response.failed`
appended right after its last logged event, and the queued task ran. Then
50 kill/restart cycles under load (responses stored, tasks created and
followed, idempotent requests) leave a sound database in which every
acknowledged object exists and every event log runs 1..N with one terminal
event, last.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from support import ROOT, SLOW_ID, SSE, body, cli_token, free_port, iter_sse, wait_task, wait_until

from lmsp_tray.store import Database

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
CYCLES = int(os.environ.get("LMSP_CRASH_CYCLES", "50"))


class Served:
    """`python -m lmsp_tray serve` on a fixed port and home, started and killed at will."""

    def __init__(self, tmp_path: Path, models_dir: Path, config: str = "") -> None:
        self.home = tmp_path / "lmsp"
        (self.home / "config").mkdir(parents=True)
        (self.home / "config" / "config.toml").write_text(f"demo_model = false\n{config}")
        user = tmp_path / "user"
        user.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR"}}
        self.env.update(
            {
                "LMSP_TRAY_HOME": str(self.home),
                "HOME": str(user),
                "HF_HOME": str(user / "hf"),
                "OLLAMA_MODELS": str(user / "ollama"),
                "XDG_CACHE_HOME": str(user / ".cache"),
            }
        )
        self.models_dir = models_dir
        self.token = cli_token(
            [sys.executable, "-m", "lmsp_tray"],
            self.env,
            "models:read",
            "models:manage",
            "responses:create",
            "responses:read",
            "tasks:create",
            "tasks:read",
            cwd=ROOT,
        )
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/lmsp/v1"
        self.proc: subprocess.Popen | None = None

    @property
    def database(self) -> Path:
        return self.home / "data" / "lmsp-tray.sqlite3"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lmsp_tray",
                "serve",
                "--port",
                str(self.port),
                "--models-dir",
                str(self.models_dir),
                "--no-default-dirs",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait_ready(self, timeout: float = 90) -> None:
        proc = self.proc
        assert proc is not None

        def answered() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the service exited: {proc.stderr.read().decode()[-3000:]}")
            return httpx.get(self.url, timeout=1).status_code == 200

        wait_until(answered, timeout, "the service to answer", interval=0.05, ignoring=httpx.HTTPError)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc.stderr.close()

    def terminate(self) -> str:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err.decode()[-3000:]
        return err.decode()


def read_all(c: httpx.Client, task_id: str, stop_after: int | None = None) -> list[SSE]:
    got: list[SSE] = []
    with c.stream("GET", f"/tasks/{task_id}/events") as r:
        assert r.status_code == 200
        for e in iter_sse(r):
            if isinstance(e, SSE):
                got.append(e)
                if stop_after is not None and len(got) >= stop_after:
                    break
    return got


def text_of(evs: list[SSE]) -> str:
    return "".join(e.data["delta"] for e in evs if e.event == "response.output_text.delta")


def test_sigkill_mid_task_then_restart(tmp_path: Path, models_dir: Path) -> None:
    served = Served(tmp_path, models_dir, "parallel = 1\n")  # one task at a time: the second one waits
    served.start()
    served.wait_ready()
    with httpx.Client(base_url=served.url, timeout=60, headers=served.headers) as c:
        stored = c.post("/responses", json=body("keep this", max_output_tokens=5, store=True)).json()
        finished = c.post("/tasks", json=body("a finished task", max_output_tokens=6)).json()
        finished_events = read_all(c, finished["id"])
        finished_doc = c.get(f"/tasks/{finished['id']}").json()
        running = c.post("/tasks", json=body("a long task", model=SLOW_ID, max_output_tokens=4000)).json()
        queued = c.post("/tasks", json=body("a queued task", max_output_tokens=5)).json()
        seen = read_all(c, running["id"], stop_after=12)
        assert c.get(f"/tasks/{running['id']}").json()["status"] == "in_progress"
        assert c.get(f"/tasks/{queued['id']}").json()["status"] == "queued"
    served.kill()

    served.start()
    served.wait_ready()
    with httpx.Client(base_url=served.url, timeout=60, headers=served.headers) as c:
        assert c.get(f"/responses/{stored['id']}").json() == stored
        assert c.get(f"/tasks/{finished['id']}").json() == finished_doc
        assert [(e.id, e.event, e.data) for e in read_all(c, finished["id"])] == [
            (e.id, e.event, e.data) for e in finished_events
        ]

        doc = c.get(f"/tasks/{running['id']}").json()
        assert doc["status"] == "failed" and doc["error"]["code"] == "service_restarted"
        evs = read_all(c, running["id"])
        assert [e.id for e in evs] == list(range(1, len(evs) + 1))
        assert [(e.id, e.event, e.data) for e in evs[: len(seen)]] == [(e.id, e.event, e.data) for e in seen]
        assert evs[-1].event == "response.failed" and sum(e.event in TERMINAL for e in evs) == 1
        assert evs[-1].data["error"]["code"] == "service_restarted"
        assert evs[-1].data["sequence_number"] == evs[-1].id and evs[-1].data["response_id"] == running["response_id"]
        # The output produced before the crash is in the failed response.
        partial = evs[-1].data["response"]
        assert partial["status"] == "failed" and doc["response"] == partial
        assert partial["output"][0]["content"][0]["text"] == text_of(evs) != ""

        done = wait_task(c, queued["id"], {"completed", "incomplete"})
        assert done["response"]["output"][0]["content"][0]["text"]
    served.terminate()
    with Database(served.database) as db:
        assert db.integrity_check() == "ok"


class Load:
    """Clients hammering the service until it dies; remembers what the service acknowledged."""

    def __init__(self, url: str, rnd: random.Random, headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers
        self.rnd = rnd
        self.tasks: set[str] = set()  # 202 received: must exist after any crash
        self.stored: dict[str, dict] = {}  # 200 with store: true
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(3)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _run(self, worker: int) -> None:
        rnd = random.Random(self.rnd.random())
        with httpx.Client(base_url=self.url, timeout=30, headers=self.headers) as c:
            while not self.stop.is_set():
                try:
                    self._one(c, rnd, worker)
                except (httpx.HTTPError, json.JSONDecodeError):
                    time.sleep(0.02)  # the service was killed (or not up yet)

    def _one(self, c: httpx.Client, rnd: random.Random, worker: int) -> None:
        kind = rnd.random()
        headers = {"Idempotency-Key": f"k{rnd.randrange(10**9)}"} if rnd.random() < 0.3 else {}
        if kind < 0.45:
            r = c.post(
                "/tasks",
                json=body(f"task {worker}", max_output_tokens=rnd.randint(4, 40), store=rnd.random() < 0.5),
                headers=headers,
            )
            if r.status_code == 202:
                self.tasks.add(r.json()["id"])
                if rnd.random() < 0.5:
                    read_all(c, r.json()["id"], stop_after=rnd.randint(1, 30))
            elif r.status_code != 503:
                self.errors.append(f"POST /tasks {r.status_code}: {r.text[:200]}")
        elif kind < 0.8:
            r = c.post(
                "/responses",
                json=body(f"stored {worker}", max_output_tokens=rnd.randint(2, 12), store=True),
                headers=headers,
            )
            if r.status_code == 200:
                self.stored[r.json()["id"]] = r.json()
            elif r.status_code not in (429, 503):
                self.errors.append(f"POST /responses {r.status_code}: {r.text[:200]}")
        else:
            with c.stream(
                "POST", "/responses", json=body("streamed", max_output_tokens=20, stream=True), headers=headers
            ) as r:
                for _ in iter_sse(r):
                    pass


@pytest.mark.timeout(1800)
def test_kill_restart_cycles_under_load(tmp_path: Path, models_dir: Path) -> None:
    served = Served(tmp_path, models_dir, "parallel = 2\n")
    rnd = random.Random(1234)
    acknowledged_tasks: set[str] = set()
    stored: dict[str, dict] = {}
    for cycle in range(CYCLES):
        served.start()
        if cycle % 10 == 9:  # killed while starting: importing, opening, migrating, recovering
            time.sleep(rnd.uniform(0.2, 1.5))
            served.kill()
            continue
        served.wait_ready()
        load = Load(served.url, rnd, served.headers)
        load.start()
        time.sleep(rnd.uniform(0.3, 1.5))
        served.kill()
        load.join()
        assert not load.errors, load.errors[:5]
        acknowledged_tasks |= load.tasks
        stored.update(load.stored)

    served.start()
    served.wait_ready()
    with httpx.Client(base_url=served.url, timeout=60, headers=served.headers) as c:
        for task_id in acknowledged_tasks:
            wait_task(c, task_id, {"completed", "incomplete", "failed", "cancelled"})
        for rid, doc in stored.items():
            assert c.get(f"/responses/{rid}").json() == doc
    served.terminate()

    with Database(served.database) as db:
        assert db.integrity_check() == "ok"
    conn = sqlite3.connect(f"file:{served.database}?mode=ro", uri=True)
    try:
        tasks = dict(conn.execute("SELECT id, status FROM tasks").fetchall())
        assert acknowledged_tasks <= set(tasks)
        assert set(tasks.values()) <= {"completed", "incomplete", "failed", "cancelled"}
        restarted = 0
        for task_id in tasks:
            rows = conn.execute(
                "SELECT seq, event, data FROM events WHERE owner_id = ? ORDER BY seq", (task_id,)
            ).fetchall()
            seqs = [r[0] for r in rows]
            assert seqs == list(range(1, len(seqs) + 1)), f"{task_id}: {seqs}"
            names = [r[1] for r in rows]
            assert names[0] == "response.created" and names[-1] in TERMINAL, f"{task_id}: {names}"
            assert sum(n in TERMINAL for n in names) == 1
            restarted += (json.loads(rows[-1][2]).get("error") or {}).get("code") == "service_restarted"
        assert restarted >= 1, "no cycle killed a running task"
    finally:
        conn.close()
    # The load was real: many acknowledged tasks and stored responses went through the crashes.
    assert len(acknowledged_tasks) >= CYCLES // 2 and len(stored) >= CYCLES // 5
