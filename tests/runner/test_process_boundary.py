"""The service never loads llama.cpp: only its model processes (and the device probe) do.

A real `lmsp-tray serve` loads a model and answers a request with it; the service's own process
then has no `libllama` or `libggml` mapped, while the model process it started has both (so the
check can see them where they are).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import TINY_ID, cli_token, free_port, wait_until

LIBRARIES = ("libllama", "libggml")

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps (Linux)")


def llama_libraries(pid: int) -> set[str]:
    """The llama.cpp libraries process `pid` has mapped."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {Path(line.split()[-1]).name for line in maps.splitlines() if any(lib in line for lib in LIBRARIES)}


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:  # the field after the state: the parent's id
            found.append(int(stat.parent.name))
    return found


def test_the_service_maps_no_llama_library_while_its_model_process_does(env: dict[str, str], models_dir: Path) -> None:
    program = [sys.executable, "-m", "lmsp_tray"]
    headers = {"Authorization": f"Bearer {cli_token(program, env)}"}
    port = free_port()
    serve = [*program, "serve", "--port", str(port), "--models-dir", str(models_dir), "--no-default-dirs"]
    proc = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/lmsp/v1"
    try:

        def answered() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
            return httpx.get(url, timeout=1).status_code == 200

        wait_until(answered, 60, f"{url} to answer", interval=0.1, ignoring=httpx.HTTPError)
        with httpx.Client(timeout=120, headers=headers) as c:
            r = c.post(f"{url}/responses", json={"model": TINY_ID, "input": "hello", "max_output_tokens": 8})
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["status"] in {"completed", "incomplete"} and answer["usage"]["output_tokens"] > 0
            models = c.get(f"{url}/models").json()["data"]
            assert next(m for m in models if m["id"] == TINY_ID)["state"] == "loaded"

        assert llama_libraries(proc.pid) == set(), "the service process loaded llama.cpp"
        model_processes = [pid for pid in children(proc.pid) if llama_libraries(pid)]
        assert len(model_processes) == 1  # the tiny model's: the check sees the libraries where they are
        assert {"libllama", "libggml"} <= {name.split(".so")[0] for name in llama_libraries(model_processes[0])}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
