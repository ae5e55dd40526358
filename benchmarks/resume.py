"""Resuming a long conversation after the model was unloaded, and after the service restarted.

    .venv/bin/python benchmarks/resume.py [--history-turns 48]

A 48-turn conversation (about 5,700 tokens, Gemma 3 270M, same threads for every
peer) is evaluated once; then the next turn's time to first token is measured:

  lmsp-tray, prompt cache on    after POST /models/{id}/unload, and after the service restarted
                                (SIGTERM: its model processes save as they close)
  lmsp-tray, prompt cache off   after an unload: the whole history evaluated again (cold prefill)
  llama-server -np 1            restarted with the same history: cold prefill
  llama-server slot restore     --slot-save-path: saved by hand before the restart, restored by hand
                                after it (POST /slots/0?action=restore), then the turn

and, after one more restart, regenerating the last reply (the same last prompt sent again: the
saved state's window ends past it, so the window checkpoint saved with it serves).

Also the unload's own time (the request until the model is idle again, the write included), the
saved file's size, and cold prefill lmsp-tray / llama-server. One round: each cold prefill takes
tens of seconds on two cores; compare the ratios, which are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from common import (
    BENCH_SCOPES,
    GEMMA_ID,
    ServiceURL,
    free_port,
    gemma_path,
    llama_server_binary,
    physical_cores,
    wait_http,
)
from long_history import history, stream_llama_server
from throughput import history_prompt, llama_server, lmsp_history_turn

LAST = "Thanks. And then?"
CACHE_OFF = "(a) lmsp-tray, cache off, after unload"


@contextlib.contextmanager
def service_home(model: Path, threads: int, config: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A home folder with the model and a token, for services started (and restarted) in it."""
    with tempfile.TemporaryDirectory() as home:
        models = Path(home) / "models-in"
        models.mkdir()
        (models / model.name).symlink_to(model)
        (Path(home) / "config").mkdir()
        (Path(home) / "config" / "config.toml").write_text(
            f"threads = {threads}\ndemo_model = false\nparallel = 1\nkeep_alive = '1h'\n{config}"
        )
        env = {**os.environ, "LMSP_TRAY_HOME": home}
        scopes = [arg for scope in BENCH_SCOPES for arg in ("--scope", scope)]
        made = subprocess.run(
            [sys.executable, "-m", "lmsp_tray", "tokens", "create", "--name", "bench", *scopes],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        yield Path(home), {"Authorization": f"Bearer {made.stdout.strip()}"}


@contextlib.contextmanager
def serve(home: Path, headers: dict[str, str]) -> Iterator[ServiceURL]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmsp_tray", "serve", "--port", str(port), "--models-dir", str(home / "models-in")]
        + ["--no-default-dirs"],
        env={**os.environ, "LMSP_TRAY_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = ServiceURL(f"http://127.0.0.1:{port}/lmsp/v1", headers)
    try:
        wait_http(url)
        yield url
    finally:
        proc.terminate()  # SIGTERM: the service closes its models, which save their states
        proc.wait(120)


def cache_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in (home / "cache" / "prompt-cache").rglob("*.kvstate"))


def lmsp_peers(c: httpx.Client, model: Path, threads: int, base: list, questions: list[str]) -> dict[str, float]:
    q1, q2, q3 = questions
    rows: dict[str, float] = {}
    with service_home(model, threads, "") as (home, headers):
        with serve(home, headers) as url:
            cold, reply, new = lmsp_history_turn(c, url, base, q1)
            rows["lmsp-tray cold prefill (first turn)"] = cold
            print(f"history: {new} prompt tokens evaluated cold in {cold:.2f} s", flush=True)
            turns = [*base, (q1, reply)]
            start = time.perf_counter()
            c.post(f"{url}/models/{GEMMA_ID}/unload", headers=url.headers).raise_for_status()
            rows["lmsp-tray unload, state written (s)"] = time.perf_counter() - start
            size = c.get(f"{url}/models/{GEMMA_ID}", headers=url.headers).json()["extensions"]["lmsp_tray"]
            print(f"saved: {size.get('prompt_cache_bytes', 0) / 2**20:.1f} MiB", flush=True)
            ttft, restored, new = lmsp_history_turn(c, url, turns, q2)
            rows["lmsp-tray resume after unload"] = ttft
            ext = c.get(f"{url}/models/{GEMMA_ID}", headers=url.headers).json()["extensions"]["lmsp_tray"]
            rows["lmsp-tray model load (process start included)"] = ext["load_seconds"]
            print(f"after unload: {ttft * 1000:.0f} ms, {new} new tokens; the model's load {ext['load_seconds']:.2f} s")
        with serve(home, headers) as url:
            c.post(f"{url}/models/{GEMMA_ID}/load", headers=url.headers).raise_for_status()
            ttft, reply, new = lmsp_history_turn(c, url, [*turns, (q2, restored)], q3)
            rows["lmsp-tray resume after restart"] = ttft
            print(f"after restart: {ttft * 1000:.0f} ms, {new} new tokens ({cache_bytes(home) / 2**20:.1f} MiB)")
            last = [*turns, (q2, restored), (q3, reply)]
            ttft, _, new = lmsp_history_turn(c, url, last, LAST)
            print(f"the turn after that, warm: {ttft * 1000:.0f} ms, {new} new tokens", flush=True)
        with serve(home, headers) as url:  # regenerate that last reply after a restart: a window checkpoint
            c.post(f"{url}/models/{GEMMA_ID}/load", headers=url.headers).raise_for_status()
            ttft, _, new = lmsp_history_turn(c, url, last, LAST)
            rows["lmsp-tray regenerate the last reply after restart"] = ttft
            print(f"regenerated after a restart: {ttft * 1000:.0f} ms, {new} new tokens", flush=True)
    with service_home(model, threads, "prompt_cache_gib = 0\n") as (home, headers), serve(home, headers) as url:
        lmsp_history_turn(c, url, base, q1, tokens=2)
        c.post(f"{url}/models/{GEMMA_ID}/unload", headers=url.headers).raise_for_status()
        ttft, full, new = lmsp_history_turn(c, url, turns, q2)
        rows[CACHE_OFF] = ttft
        print(f"cache off: {ttft:.2f} s, {new} new tokens; the reply is the restored one's: {full == restored}")
    return rows


def save_slot(c: httpx.Client, url: str) -> None:
    """llama-server's slot save, asked again once if the server closed the pooled connection as it
    was reused (seen 2 times in 6 runs: `Server disconnected without sending a response`)."""
    try:
        c.post(url, json={"filename": "conv.bin"}).raise_for_status()
    except httpx.RemoteProtocolError:
        c.post(url, json={"filename": "conv.bin"}, headers={"Connection": "close"}).raise_for_status()


def llama_server_peers(
    c: httpx.Client, model: Path, threads: int, base: list, questions: list[str]
) -> dict[str, float]:
    q1, q2, _ = questions
    binary = llama_server_binary()
    rows: dict[str, float] = {}
    first = history_prompt(base, q1)
    with tempfile.TemporaryDirectory() as slots:
        extra = ("--swa-full", "--slot-save-path", slots + "/")
        with llama_server(binary, model, parallel=1, threads=threads, extra=extra) as ls:
            ttft, reply = stream_llama_server(c, ls, first, 32)
            rows["(b) llama-server restarted, same history"] = ttft
            print(f"llama-server cold: {ttft:.2f} s", flush=True)
            save_slot(c, f"{ls}/slots/0?action=save")
        with llama_server(binary, model, parallel=1, threads=threads, extra=extra) as ls:
            start = time.perf_counter()
            c.post(f"{ls}/slots/0?action=restore", json={"filename": "conv.bin"}).raise_for_status()
            restore = time.perf_counter() - start
            ttft, _ = stream_llama_server(c, ls, history_prompt([*base, (q1, reply)], q2), 32)
            rows["(c) llama-server slot restore + next turn"] = restore + ttft
            print(
                f"llama-server restore {restore * 1000:.0f} ms, then the next turn's first token {ttft * 1000:.0f} ms"
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history-turns", type=int, default=48)
    parser.add_argument("--only", choices=("lmsp-tray", "llama-server"), help="run one side only")
    args = parser.parse_args()
    threads = physical_cores()
    model = gemma_path()
    base = history(args.history_turns)
    questions = [f"Turn {i} of today: what should the keeper do next, in one line?" for i in (1, 2, 3)]
    rows: dict[str, float] = {}
    with httpx.Client(timeout=900) as c:
        if args.only != "llama-server":
            rows.update(lmsp_peers(c, model, threads, base, questions))
        if args.only != "lmsp-tray":
            rows.update(llama_server_peers(c, model, threads, base, questions))
    for name, value in rows.items():
        print(f"{name:48s} {value * 1000:9.0f} ms")
    if args.only:
        return 0
    ours = rows["lmsp-tray resume after unload"], rows["lmsp-tray resume after restart"]
    for label, mine in zip(("after unload", "after restart"), ours, strict=True):
        print(
            f"{label}: / (a) cache off {mine / rows[CACHE_OFF]:.3f} (<= 0.05), "
            f"/ (b) llama-server restarted {mine / rows['(b) llama-server restarted, same history']:.3f} (<= 0.05), "
            f"/ (c) slot restore {mine / rows['(c) llama-server slot restore + next turn']:.2f} (<= 1.5)"
        )
    regen = rows.get("lmsp-tray regenerate the last reply after restart")
    if regen is not None:
        print(f"regenerate the last reply after a restart: / (a) cache off {regen / rows[CACHE_OFF]:.3f}")
    load = rows["lmsp-tray model load (process start included)"]
    print(
        f"after unload, less the model's own load (llama.cpp reads the file and builds the context): "
        f"/ (a) {(ours[0] - load) / rows[CACHE_OFF]:.3f}, "
        f"/ (b) {(ours[0] - load) / rows['(b) llama-server restarted, same history']:.3f}"
    )
    cold = rows["(b) llama-server restarted, same history"]
    print(
        f"cold prefill lmsp-tray / llama-server: first turn {rows['lmsp-tray cold prefill (first turn)'] / cold:.2f} "
        f"(<= 1.05; ours includes loading the model), after an unload with the cache off "
        f"{rows[CACHE_OFF] / cold:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
