"""A model's failure never takes the service down: real model processes, really killed.

Each loaded model runs in a process of its own. Here a model's file is cut
short under it mid-stream (llama.cpp maps the weights: SIGBUS) and its process
is killed with SIGKILL (what the out-of-memory killer sends), SIGBUS and
SIGABRT (what a `GGML_ASSERT` ends in) while a second model streams. The
victim's stream ends with a `response.failed` event (`model_crashed`, saying
what happened, the output so far kept); the model shows `error` with that
reason to the API and to the manager's listeners (the tray); the second
model's stream finishes intact, the same text as alone; and the next request
loads the crashed model again. A task on a crashed model ends `failed` the
same way, its events closed by the terminal event.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from support import SSE, LiveDaemon, body, events, iter_sse, wait_until

from lmsp_tray.desktop.backend import DaemonTrayBackend
from lmsp_tray.desktop.service_notices import crash_notification

VICTIM = "victim-test:4m-f32"
BYSTANDER = "bystander-test:4m-f32"
SLOW = {"size_label": "4M", "context_length": 4096, "embedding": 256, "blocks": 4, "ffn": 1024}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("crash-models")
    return {
        "victim": write_tiny_gguf(folder / "victim-test.gguf", basename="victim-test", seed=3, **SLOW),
        "bystander": write_tiny_gguf(folder / "bystander-test.gguf", basename="bystander-test", seed=4, **SLOW),
    }


@pytest.fixture
def model_files(generated: dict[str, Path]) -> list[Path]:
    return list(generated.values())


@pytest.fixture
def models_copied() -> bool:
    return True  # copies this test may damage (the module's generated files stay untouched)


class Stream:
    """A streaming response read on its own thread: its events, and whether it is still running."""

    def __init__(self, live: LiveDaemon, payload: dict) -> None:
        self.events: list[SSE] = []
        self.first_delta = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(live, payload), daemon=True)
        self._thread.start()

    def _run(self, live: LiveDaemon, payload: dict) -> None:
        try:
            with (
                httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c,
                c.stream("POST", "/responses", json=payload) as r,
            ):
                for e in iter_sse(r):
                    if isinstance(e, SSE):
                        self.events.append(e)
                        if e.event == "response.output_text.delta":
                            self.first_delta.set()
        finally:
            self.first_delta.set()
            self.done.set()

    def join(self) -> list[SSE]:
        self._thread.join(300)
        assert self.done.is_set()
        return self.events

    @property
    def text(self) -> str:
        return "".join(e.data["delta"] for e in self.events if e.event == "response.output_text.delta")


def long_stream(live: LiveDaemon, model: str, tokens: int) -> Stream:
    stream = Stream(live, body("the local model", model=model, max_output_tokens=tokens, stream=True))
    assert stream.first_delta.wait(120)
    return stream


def alone(live: LiveDaemon, model: str, tokens: int) -> str:
    with httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c:
        r = c.post("/responses", json=body("the local model", model=model, max_output_tokens=tokens))
        assert r.status_code == 200, r.text
        return r.json()["output"][0]["content"][0]["text"]


@pytest.fixture
def watched(daemon_factory) -> Iterator[LiveDaemon]:
    """A daemon of each test's own (its model processes get killed), whose model states are heard.

    Without speculative decoding: these tests compare a bystander's stream with its answer asked
    alone, and a second asking drafts the first answer (`speculation.Recent`); verified in batches,
    whose rounding differs from a one-token step, a near-tie of this random model can fall the other
    way (logprobs -0.7753 and -0.7786 at its 310th token). Drafting's exactness is tested on its own
    (tests/runner/test_speculative.py); here the subject is the crash."""
    live = daemon_factory(parallel=2, speculative=False)
    heard: list[tuple[str, str]] = []
    live.daemon.models.subscribe(lambda model_id, state: heard.append((model_id, state)))
    live.heard = heard  # type: ignore[attr-defined]
    yield live


def victim_pid(live: LiveDaemon) -> int:
    model = live.daemon.models.get(VICTIM)
    assert model is not None
    pid = model.pid  # type: ignore[attr-defined]
    assert pid != os.getpid()
    return pid


def check_crash(
    live: LiveDaemon, victim: Stream, bystander: Stream, expected_text: str, says: str, file_gone: bool = False
) -> None:
    """What every crash must look like from outside."""
    evs = victim.join()
    last = evs[-1]
    assert last.event == "response.failed", [e.event for e in evs[-3:]]
    error = last.data["response"]["error"]
    assert error["code"] == "model_crashed" and VICTIM in error["detail"] and says in error["detail"], error
    assert [e.id for e in evs] == list(range(1, len(evs) + 1))
    kept = last.data["response"]["output"][0]["content"][0]["text"]
    assert kept == victim.text and kept  # the output so far is in the failed response
    # The other model never noticed: its stream ends normally with the same text as alone.
    other = bystander.join()
    assert other[-1].event == "response.incomplete", other[-1].event  # max_output_tokens reached
    assert bystander.text == expected_text
    # The manager (and so the tray) knows why; unless the file left the catalog first (its header
    # unreadable), and the model was unloaded for that.
    heard = live.heard  # type: ignore[attr-defined]
    assert (VICTIM, "error") in heard or (file_gone and (VICTIM, "unloading") in heard), heard
    state, reason = live.daemon.models.state(VICTIM)
    if state == "error":
        assert reason is not None and reason.code == "model_crashed"


def serves_again(live: LiveDaemon) -> None:
    with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c:
        r = c.post("/responses", json=body("again", model=VICTIM, max_output_tokens=5))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["output_tokens"] == 5
        assert c.get(f"/models/{VICTIM}").json()["state"] == "loaded"


@pytest.mark.parametrize(
    ("signum", "says"),
    [(signal.SIGKILL, "SIGKILL"), (signal.SIGBUS, "changed or was cut short"), (signal.SIGABRT, "aborted")],
    ids=["SIGKILL", "SIGBUS", "SIGABRT"],
)
def test_a_killed_model_process_fails_its_streams_only(watched: LiveDaemon, signum: int, says: str) -> None:
    expected = alone(watched, BYSTANDER, 600)
    bystander = long_stream(watched, BYSTANDER, 600)
    victim = long_stream(watched, VICTIM, 4000)
    pid = victim_pid(watched)
    os.kill(pid, signum)
    assert not bystander.done.is_set(), "the second stream must still be running when the first model dies"
    check_crash(watched, victim, bystander, expected, says)
    with httpx.Client(base_url=watched.url, timeout=60, headers=watched.auth_headers) as c:
        doc = c.get(f"/models/{VICTIM}").json()
        assert doc["state"] == "error" and doc["error"]["code"] == "model_crashed", doc
        assert c.get("/").status_code == 200  # the service answers throughout
    # The tray's menu shows the reason beside the model, and a notification says it.
    view = {m.id: m for m in DaemonTrayBackend(watched.daemon, autostart=None).snapshot().models}[VICTIM]
    assert view.state == "error" and says in (view.error or "")
    note = crash_notification(VICTIM, watched.daemon.models.state(VICTIM)[1])
    assert note is not None and VICTIM in note and says in note
    assert crash_notification(BYSTANDER, watched.daemon.models.state(BYSTANDER)[1]) is None
    wait_until(lambda: not _alive(pid), 30, "the killed model process to be gone")
    serves_again(watched)
    assert victim_pid(watched) != pid


def test_a_model_file_cut_short_mid_stream_ends_that_model_only(watched: LiveDaemon, models_dir: Path) -> None:
    path = models_dir / "victim-test.gguf"
    original = path.read_bytes()
    expected = alone(watched, BYSTANDER, 600)
    bystander = long_stream(watched, BYSTANDER, 600)
    victim = long_stream(watched, VICTIM, 4000)
    pid = victim_pid(watched)
    with open(path, "r+b") as fh:  # what a re-download writing the file in place does first
        fh.truncate(len(original) // 3)
    check_crash(watched, victim, bystander, expected, "changed or was cut short", file_gone=True)
    assert not _alive(pid)
    with open(path, "r+b") as fh:  # the download completes: the same model again
        fh.write(original)
    with httpx.Client(base_url=watched.url, timeout=60, headers=watched.auth_headers) as c:
        wait_until(
            lambda: c.get(f"/models/{VICTIM}").json().get("size_bytes") == len(original),
            30,
            "the mended file to be seen",
        )
    serves_again(watched)


def test_a_task_on_a_crashed_model_ends_failed_with_its_output(watched: LiveDaemon) -> None:
    with httpx.Client(base_url=watched.url, timeout=120, headers=watched.auth_headers) as c:
        r = c.post("/tasks", json=body("the local model", model=VICTIM, max_output_tokens=4000))
        assert r.status_code == 202, r.text
        task = r.json()
        got: list[SSE] = []
        killed = False
        with c.stream("GET", f"/tasks/{task['id']}/events") as stream:
            for e in iter_sse(stream):
                if not isinstance(e, SSE):
                    continue
                got.append(e)
                if not killed and len([x for x in got if x.event == "response.output_text.delta"]) == 5:
                    os.kill(victim_pid(watched), signal.SIGKILL)
                    killed = True
        assert got[-1].event == "response.failed" and got[-1].data["error"]["code"] == "model_crashed"
        doc = wait_until(
            lambda: (d := c.get(f"/tasks/{task['id']}").json())["status"] == "failed" and d, 30, "the task to fail"
        )
        assert doc["error"]["code"] == "model_crashed"
        text = "".join(e.data["delta"] for e in got if e.event == "response.output_text.delta")
        assert doc["response"]["output"][0]["content"][0]["text"] == text
        # Read again from the start: the same events, the terminal one last.
        with c.stream("GET", f"/tasks/{task['id']}/events") as stream:
            again = events(stream)
        assert [e.event for e in again] == [e.event for e in got]
    serves_again(watched)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): look at its state
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
