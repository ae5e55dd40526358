"""One instance per home, and start-ups a person can see: real `lmsp-tray` processes, real signals,
a real notification server on a private D-Bus (tests/notify_server.py), the real log file.

- Two launches at the same moment: exactly one serves, the other says "already running".
- A launch while the first is busy (stopped with SIGSTOP, so it answers nothing) still says
  "already running", never "port in use"; a killed instance leaves no lock behind.
- A second launch asks the running one to show itself: a headless one raises a notification.
- Each start-up failure is one line on stderr, in the log file and in a notification.
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest
from desktop_support import PrivateBus, dbus_missing, lmsp_env, log_text, program
from notify_server import NotifyServer
from support import free_port, wait_until

SERVE = ["serve", "--no-default-dirs"]


def start(env: dict, models_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    with out.open("w") as fh:
        return subprocess.Popen(
            [*program(), *SERVE, "--models-dir", str(models_dir), *extra], env=env, stdout=fh, stderr=subprocess.STDOUT
        )


def wait_serving(tmp_path: Path, procs: list[subprocess.Popen], timeout: float = 60) -> str:
    discovery = tmp_path / "lmsp" / "run" / "service.json"

    def serving() -> str | None:
        assert any(p.poll() is None for p in procs), "every process exited"
        url = json.loads(discovery.read_text())["url"]
        return url if httpx.get(url, timeout=2).status_code == 200 else None

    return wait_until(
        serving, timeout, "a process to serve", interval=0.05, ignoring=(OSError, ValueError, KeyError, httpx.HTTPError)
    )


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


@pytest.mark.parametrize("round_", range(3))
def test_two_launches_at_the_same_moment_exactly_one_serves(tmp_path, models_dir, round_):
    env = lmsp_env(tmp_path)
    outs = [tmp_path / "a.out", tmp_path / "b.out"]
    # --port 0: without the lock both would bind a port of their own and both would serve.
    procs = [start(env, models_dir, out, "--port", "0") for out in outs]
    try:
        url = wait_serving(tmp_path, procs)
        wait_until(lambda: any(p.poll() is not None for p in procs), 60, "one of the two to exit", interval=0.05)
        finished = [p for p in procs if p.poll() is not None]
        assert len(finished) == 1, [o.read_text() for o in outs]
        loser = finished[0]
        assert loser.returncode == 0
        winner = next(p for p in procs if p is not loser)
        said = outs[procs.index(loser)].read_text()
        assert f"lmsp-tray is already running at {url} (pid {winner.pid})" in said, said
        assert "port" not in said.lower().replace(url, "") and "Traceback" not in said
        info = json.loads((tmp_path / "lmsp" / "data" / "instance.json").read_text())
        assert info["pid"] == winner.pid and info["role"] == "service" and info["url"] == url
    finally:
        stop_all(procs)


def test_a_busy_instance_is_already_running_never_port_in_use(tmp_path, models_dir):
    env = lmsp_env(tmp_path)
    port = free_port()
    first = start(env, models_dir, tmp_path / "first.out", "--port", str(port))
    try:
        url = wait_serving(tmp_path, [first])
        first.send_signal(signal.SIGSTOP)  # busy for as long as we like: it answers nothing
        second = subprocess.run(
            [*program(), *SERVE, "--models-dir", str(models_dir), "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = second.stdout + second.stderr
        assert second.returncode == 0, said
        assert f"lmsp-tray is already running at {url} (pid {first.pid}); it is not answering right now" in said
        assert "cannot listen" not in said and "another program" not in said.lower()
        first.send_signal(signal.SIGCONT)
        assert httpx.get(url, timeout=10).status_code == 200
    finally:
        stop_all([first])


def test_a_killed_instance_leaves_no_lock_and_stop_ends_a_running_one(tmp_path, models_dir):
    env = lmsp_env(tmp_path)
    first = start(env, models_dir, tmp_path / "first.out", "--port", "0")
    try:
        wait_serving(tmp_path, [first])
        first.kill()  # no clean-up at all: the OS drops the lock; instance.json stays, stale
        first.wait(10)
        second = start(env, models_dir, tmp_path / "second.out", "--port", "0")
        url = wait_serving(tmp_path, [second])
        assert json.loads((tmp_path / "lmsp" / "data" / "instance.json").read_text())["pid"] == second.pid
        stopped = subprocess.run([*program(), "stop"], env=env, capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0 and f"stopped lmsp-tray at {url} (pid {second.pid})" in stopped.stderr
        assert second.wait(10) == 0
        assert not (tmp_path / "lmsp" / "data" / "instance.json").exists()
        again = subprocess.run([*program(), "stop"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "not running" in again.stderr
    finally:
        stop_all([first])


# -- what a person started from a launcher sees ---------------------------------------------------


@pytest.fixture
def session(tmp_path):
    missing = dbus_missing()
    if missing:
        pytest.skip(missing)
    with PrivateBus() as bus:
        server = NotifyServer(bus.address, tmp_path / "notifications.jsonl")
        try:
            yield bus, server
        finally:
            server.stop()


def test_a_second_launch_makes_a_headless_instance_say_so(tmp_path, models_dir, session):
    bus, server = session
    env = lmsp_env(tmp_path, bus=bus.address)
    first = start(env, models_dir, tmp_path / "first.out", "--port", "0")
    try:
        url = wait_serving(tmp_path, [first])
        second = subprocess.run(
            [*program(), *SERVE, "--models-dir", str(models_dir)], env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 0 and "Asked it to show itself." in second.stdout
        note = server.wait(
            lambda n: n["summary"] == "lmsp-tray is already running", what="the running one's notification"
        )
        assert url in note["body"] and "without a tray icon" in note["body"] and note["app"] == "lmsp-tray"
        assert "a second launch asked this instance to show itself" in log_text(tmp_path)
    finally:
        stop_all([first])


def failure(tmp_path: Path, env: dict, models_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    out = subprocess.run(
        [*program(), *SERVE, "--models-dir", str(models_dir), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in out.stderr + out.stdout
    return out, log_text(tmp_path)


def test_start_up_failures_reach_the_log_file_and_a_notification(tmp_path, models_dir, session):
    bus, server = session
    env = lmsp_env(tmp_path, bus=bus.address)
    config = tmp_path / "lmsp" / "config" / "config.toml"
    config.parent.mkdir(parents=True)

    # A misspelt setting: the notification says which and what was meant.
    config.write_text('model_dirs = ["~/models"]\n')
    out, log = failure(tmp_path, env, models_dir)
    expected = f"{config}: unknown setting 'model_dirs'; did you mean 'models_dirs'?"
    assert out.returncode == 2 and f"lmsp-tray: {expected}" in out.stderr
    assert expected in log
    note = server.wait(lambda n: "model_dirs" in n["body"], what="the bad-setting notification")
    assert note["summary"].startswith("lmsp-tray could not start") and expected in note["body"]
    assert note["hints"]["urgency"] == 2 and "lmsp-tray.log" in note["body"]

    # Not text at all (UTF-16, as some editors save): named, with what to do.
    config.write_bytes("port = 7373\n".encode("utf-16"))
    out, log = failure(tmp_path, env, models_dir)
    assert out.returncode == 2 and "is UTF-16 text; TOML settings must be UTF-8 text" in out.stderr
    server.wait(lambda n: "UTF-16" in n["body"], what="the UTF-16 notification")
    config.unlink()

    # A busy port.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out, log = failure(tmp_path, env, models_dir, "--port", str(port))
    assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in log
    server.wait(lambda n: f"127.0.0.1:{port}" in n["body"], what="the busy-port notification")

    # A database from a newer lmsp-tray: refused with the version it has, the file kept untouched.
    # (A damaged one is set aside and the service starts: test_a_damaged_database_is_set_aside_....)
    db = tmp_path / "lmsp" / "data" / "lmsp-tray.sqlite3"
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    before = db.read_bytes()
    out, log = failure(tmp_path, env, models_dir, "--port", "0")
    assert out.returncode == 1 and "lmsp-tray.sqlite3" in out.stderr and "schema version 999" in out.stderr
    assert "upgrade lmsp-tray" in out.stderr and "lmsp-tray.sqlite3" in log
    server.wait(lambda n: "schema version 999" in n["body"], what="the newer-database notification")
    assert db.read_bytes() == before
    notes = server.records()
    assert len({n["id"] for n in notes}) == len(notes) and all(n["replaces"] == 0 for n in notes)


def test_a_damaged_database_is_set_aside_and_the_service_starts(tmp_path, models_dir, session):
    """Garbage where the database was: moved aside under a dated name (every byte kept), a new one
    made, and the person told where the old one went, on stderr, in the log and in a notification."""
    bus, server = session
    env = lmsp_env(tmp_path, bus=bus.address)
    db = tmp_path / "lmsp" / "data" / "lmsp-tray.sqlite3"
    db.parent.mkdir(parents=True, exist_ok=True)
    garbage = b"this is not a database at all" * 100
    db.write_bytes(garbage)
    proc = start(env, models_dir, tmp_path / "serve.out", "--port", "0")
    try:
        wait_serving(tmp_path, [proc])
        [moved] = [p for p in db.parent.iterdir() if p.name.startswith("lmsp-tray.damaged-")]
        assert moved.read_bytes() == garbage and db.read_bytes().startswith(b"SQLite format 3")
        note = server.wait(lambda n: "new database" in n["summary"], what="the set-aside notification")
        assert str(moved) in note["body"] and str(db) in note["body"] and "not deleted" in note["body"]
        said = (tmp_path / "serve.out").read_text()
        assert str(moved) in said and "Traceback" not in said
        assert str(moved) in log_text(tmp_path)
    finally:
        stop_all([proc])
