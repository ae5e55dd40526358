"""SIGTERM under load: the service ends cleanly, whatever it is doing.

A real `lmsp-tray serve` process with three streams open on a model process
and several 7 MiB request bodies arriving; SIGTERM must end it with exit code
0 (the 60 s wait below only catches a hang), every open stream closed by its
terminal event, the model processes gone with it, and no traceback.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from support import SLOW_ID, SSE, cli_headers, free_port, iter_sse, wait_url


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_with_streams_open_and_big_bodies_arriving(env: dict[str, str], models_dir: Path) -> None:
    port = free_port()
    headers = cli_headers(env)
    args = [sys.executable, "-m", "lmsp_tray", "serve", "--port", str(port), "--models-dir", str(models_dir)]
    proc = subprocess.Popen(
        [*args, "--no-default-dirs"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}/lmsp/v1"
    streams: list[list[SSE]] = [[] for _ in range(3)]
    started = [threading.Event() for _ in streams]

    def stream(i: int) -> None:
        payload = {"model": SLOW_ID, "input": f"stream {i}", "max_output_tokens": 4000, "stream": True}
        try:
            with (
                httpx.Client(timeout=120, headers=headers) as c,
                c.stream("POST", f"{url}/responses", json=payload) as r,
            ):
                for e in iter_sse(r):
                    if isinstance(e, SSE):
                        streams[i].append(e)
                        started[i].set()
        except httpx.HTTPError:
            pass
        finally:
            started[i].set()

    def big_body() -> None:
        payload = {"model": SLOW_ID, "input": "the local model " * (7 * 1024 * 1024 // 16)}
        try:
            httpx.post(f"{url}/responses", json=payload, headers=headers, timeout=120)
        except httpx.HTTPError:
            pass  # cut off by the shutdown: fine

    try:
        wait_url(url, proc)
        httpx.post(f"{url}/models/{SLOW_ID}/load", headers=headers, timeout=120).raise_for_status()
        models = children(proc.pid)
        assert models, "the model runs in a process of its own"
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(streams))]
        for t in threads:
            t.start()
        for event in started:
            assert event.wait(120)
        bodies = [threading.Thread(target=big_body) for _ in range(3)]
        for t in bodies:
            t.start()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for t in threads + bodies:
            t.join(60)
        for evs in streams:
            assert evs and evs[-1].event in {"response.cancelled", "response.failed"}, [e.event for e in evs[-2:]]
        assert not [pid for pid in models if alive(pid)], "model processes outlived the service"
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in stderr, stderr[-3000:]
        assert "did not stop within" not in stderr  # a clean stop, not the deadline
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
