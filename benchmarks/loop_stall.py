"""Do big request bodies stall the streams already running? Inter-token gaps with and without them.

    .venv/bin/python benchmarks/loop_stall.py [--streams 4] [--tokens 128] [--rounds 3] [--every 0.5]
        [--sink] [--cpu-only]

lmsp-tray serves the Gemma 3 270M file. Each round runs the same decode twice,
in alternating order: `--streams` concurrent streaming responses (temperature
0, `--tokens` output tokens each) alone, and again while a new ~8 MiB body
arrives every `--every` seconds (a long conversation of distinct messages,
just under `max_request_bytes`, far over the context window: each is refused
with `400 context_length_exceeded`; the bodies do not wait for each other). Everything a body costs — reading, JSON parsing,
validation, rendering, tokenizing, the context check — must happen without
holding up the streams' tokens.

Prints the inter-token gaps of all streams (the time between consecutive text
deltas as the client receives them) for both runs, p99 with bodies / p99
without, the longest gap with bodies against 1.5x the longest without plus
0.1 s (issue 27's target), how many bodies were answered and how long the
slowest took. A health probe (`GET /lmsp/v1` every 20 ms) measures the event
loop directly: a stalled loop answers nothing, whatever the decode does. Last,
the CPU time each process (service, model process, body worker) spends on one
body with nothing decoding: CPU seconds hardly depend on the machine's noise;
gaps do.

With `--sink`, each round runs the decode a third time while the same bodies go
to a sink that only reads them (`body_sink.py`): the client's sending and the
kernel's copying still take their CPU, no parse does. Its longest gaps are the
floor that no work in the service can go under on this machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from common import (
    GEMMA_ID,
    children,
    cpu_seconds,
    free_port,
    gemma_path,
    lmsp_service,
    physical_cores,
    print_table,
    wait_http,
)
from throughput import message

BODY_BYTES = 8 * 2**20 - 64 * 1024  # just under the default max_request_bytes (8 MiB), headers aside
WORDS = [
    "sea",
    "tide",
    "lamp",
    "keeper",
    "rock",
    "storm",
    "gull",
    "rope",
    "boat",
    "light",
    "wave",
    "cliff",
    "night",
    "fog",
    "harbor",
    "sail",
]


def big_body(seed: int) -> bytes:
    """A conversation of distinct messages (no tokenizer cache helps), just under `BODY_BYTES` long."""
    rnd = random.Random(seed)
    items: list[dict[str, str]] = []
    size = 0
    while size < BODY_BYTES:
        text = f"{seed}-{len(items)} " + " ".join(rnd.choice(WORDS) for _ in range(60))
        items.append({"role": "user" if len(items) % 2 == 0 else "assistant", "content": text})
        size += len(json.dumps(items[-1])) + 2
    while True:
        raw = json.dumps({"model": GEMMA_ID, "input": items, "max_output_tokens": 16}).encode()
        if len(raw) <= BODY_BYTES:
            return raw
        del items[-16:]


def stream_gaps(url: str, headers: dict[str, str], i: int, tokens: int, start: threading.Barrier) -> list[float]:
    """One streamed response: the gaps between its consecutive text deltas, in seconds."""
    body = {"model": GEMMA_ID, "input": message(i), "stream": True, "temperature": 0, "max_output_tokens": tokens}
    stamps: list[float] = []
    with httpx.Client(timeout=600, headers=headers) as c:
        start.wait()
        with c.stream("POST", f"{url}/responses", json=body) as r:
            r.raise_for_status()
            event = ""
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "response.output_text.delta":
                    stamps.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(stamps)]


def send(url: str, headers: dict[str, str], raw: bytes) -> tuple[int, str, float]:
    """Posts one body: (status, code, seconds to the answer).

    `verify=False`: the service is plain HTTP on loopback, so there is nothing to verify, and a client
    that verifies loads the CA bundle first: 41-58 ms of this process's CPU per body, taken from the
    threads that time the streams' tokens (and, on two cores, from the decode) while it measures."""
    with httpx.Client(timeout=600, verify=False, headers={**headers, "content-type": "application/json"}) as c:
        t = time.perf_counter()
        r = c.post(f"{url}/responses", content=raw)
        return r.status_code, str(r.json().get("code")), time.perf_counter() - t


def probe(url: str, stop: threading.Event) -> list[float]:
    """`GET /lmsp/v1` every 20 ms until `stop`: how long the event loop takes to answer anything."""
    took: list[float] = []
    with httpx.Client(timeout=600) as c:
        while not stop.wait(0.02):
            t = time.perf_counter()
            c.get(url)
            took.append(time.perf_counter() - t)
    return took


def run(
    url: str,
    headers: dict[str, str],
    args: argparse.Namespace,
    bodies: list[bytes] | None,
    to: str | None = None,
    procs: dict[str, int] | None = None,
) -> tuple:
    """One decode of `args.streams` streams; with `bodies`, one arrives every `args.every` s until it ends,
    at the service or at `to` (the sink's URL).

    Returns the streams' inter-token gaps, the health probe's answer times, the bodies' answers and the
    cores each of `procs` used on average while the streams decoded (CPU seconds per second; the bodies
    still being answered after the decode are not counted)."""
    start = threading.Barrier(args.streams + 1)
    answered: list[cf.Future] = []
    stop = threading.Event()
    with cf.ThreadPoolExecutor(args.streams + 1) as pool, cf.ThreadPoolExecutor(16) as senders:
        streams = [pool.submit(stream_gaps, url, headers, i, args.tokens, start) for i in range(args.streams)]
        start.wait()
        before = {name: cpu_seconds(pid) for name, pid in (procs or {}).items()}
        began = time.perf_counter()
        probes = pool.submit(probe, url, stop)
        k = 0
        while bodies and not all(f.done() for f in streams):
            answered.append(senders.submit(send, to or url, headers, bodies[k % len(bodies)]))
            k += 1
            cf.wait(streams, timeout=args.every)
        cf.wait(streams)
        took = time.perf_counter() - began
        cores = {name: (cpu_seconds(pid) - before[name]) / took for name, pid in (procs or {}).items()}
        gaps = [g for f in streams for g in f.result()]
        stop.set()
    return gaps, probes.result(), [f.result() for f in answered], cores


def processes(service: int) -> dict[str, int]:
    """The service's process ids by name: the service, its model process, its body worker (once started)."""
    procs = {"service": service}
    for kid, cmd in children(service).items():
        if "lmsp_tray.runner.worker" in cmd:
            procs["model process"] = kid
        elif "multiprocessing" in cmd:
            procs["body worker"] = kid
    return procs


def cpu_per_body(url: str, headers: dict[str, str], pid: int, bodies: list[bytes]) -> dict[str, float]:
    """The CPU time each process spends on one body, sent one after another with nothing decoding: the
    service (the interpreter whose lock relays every stream's tokens), the model process and the body
    worker. CPU seconds, unlike gaps, hardly depend on what else the machine runs. Gaps after these come
    from a warmer service: `main` runs this last."""
    send(url, headers, bodies[0])  # the body worker starts at the first big body (and is then kept)
    procs = processes(pid)
    before = {name: cpu_seconds(k) for name, k in procs.items()}
    for raw in bodies:
        send(url, headers, raw)
    return {name: (cpu_seconds(k) - before[name]) / len(bodies) for name, k in procs.items()}


@contextlib.contextmanager
def body_sink() -> Iterator[tuple[str, int]]:
    """`body_sink.py` in a process of its own (not this one, whose threads time the tokens): its URL and
    process id."""
    port = free_port()
    sink = subprocess.Popen([sys.executable, str(Path(__file__).with_name("body_sink.py")), str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout=30)
        yield f"http://127.0.0.1:{port}", sink.pid
    finally:
        sink.terminate()
        sink.wait()


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1] if len(values) > 1 else 0.0


WITHOUT, WITH, SINK = "without bodies", "with 8 MiB bodies", "bodies to the sink"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between two bodies (default 0.5)")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--cpu-only", action="store_true", help="only the CPU time per body (no decode, no gaps)")
    ap.add_argument("--sink", action="store_true", help="a third run per round, the bodies sent to a sink")
    args = ap.parse_args()

    bodies = [big_body(seed) for seed in range(4)]
    print(f"{len(bodies)} distinct bodies of {min(map(len, bodies)) / 2**20:.2f} MiB, one every {args.every} s")
    with contextlib.ExitStack() as stack:
        url, service = stack.enter_context(lmsp_service(gemma_path(), threads=args.threads))
        sink, sink_pid = stack.enter_context(body_sink()) if args.sink and not args.cpu_only else (None, 0)
        headers = url.headers
        deadline = time.monotonic() + 60
        while httpx.post(f"{url}/models/{GEMMA_ID}/load", headers=headers, timeout=300).status_code == 404:
            if time.monotonic() > deadline:  # discovery runs in the background at start-up
                raise RuntimeError(f"{GEMMA_ID} never appeared")
            time.sleep(0.2)
        if args.cpu_only:
            print_cpu(cpu_per_body(url, headers, service.pid, bodies * 2))
            return
        run(url, headers, argparse.Namespace(**{**vars(args), "tokens": 16}), None)  # warm-up
        send(url, headers, bodies[0])  # the body worker starts at the first big body (and is then kept)
        arms = [WITHOUT, WITH] + ([SINK] if sink else [])
        gaps_of: dict[str, list[float]] = {arm: [] for arm in arms}
        probes: dict[str, list[float]] = {arm: [] for arm in arms}
        longest: dict[str, list[float]] = {arm: [] for arm in arms}  # each decode's longest gap
        answered: list = []
        for r in range(args.rounds):
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            for arm in order:
                procs = {**processes(service.pid), "this client": os.getpid()}
                if sink:
                    procs["sink"] = sink_pid
                gaps, took, got, cores = run(
                    url, headers, args, None if arm == WITHOUT else bodies, sink if arm == SINK else None, procs
                )
                gaps_of[arm].extend(gaps)
                probes[arm].extend(took)
                longest[arm].append(max(gaps))
                if arm == WITH:
                    answered.extend(got)
                print(
                    f"round {r + 1} {arm:<22}: {len(gaps)} gaps, "
                    f"p50 {p(gaps, 0.5) * 1000:.1f} ms, p99 {p(gaps, 0.99) * 1000:.1f} ms, "
                    f"max {max(gaps) * 1000:.1f} ms; probe p99 {p(took, 0.99) * 1000:.1f} ms"
                    + (f", {len(got)} bodies answered" if arm != WITHOUT else "")
                    + f"; load average {os.getloadavg()[0]:.1f}; cores used while decoding: "
                    + ", ".join(f"{name} {used:.2f}" for name, used in cores.items()),
                    flush=True,
                )
        cpu = cpu_per_body(url, headers, service.pid, bodies * 2)
    quiet, loaded = gaps_of[WITHOUT], gaps_of[WITH]
    rows = [
        (name, str(len(g)), f"{p(g, 0.5) * 1000:.1f}", f"{p(g, 0.99) * 1000:.1f}", f"{max(g) * 1000:.1f}")
        for name, g in gaps_of.items()
    ]
    rows += [
        (
            f"{name}: health probe",
            str(len(t)),
            f"{p(t, 0.5) * 1000:.1f}",
            f"{p(t, 0.99) * 1000:.1f}",
            f"{max(t) * 1000:.1f}",
        )
        for name, t in probes.items()
    ]
    print()
    print_table(rows, ("decode", "gaps / probes", "p50 ms", "p99 ms", "max ms"))
    codes: dict[str, int] = {}
    for status, code, _ in answered:
        codes[f"{status} {code}"] = codes.get(f"{status} {code}", 0) + 1
    slowest = max((s for _, _, s in answered), default=0.0)
    print(
        f"\nbodies answered: {sum(codes.values())} ({', '.join(f'{n}x {c}' for c, n in codes.items())}), "
        f"slowest answer {slowest:.2f} s"
    )
    ratio = p(loaded, 0.99) / p(quiet, 0.99)
    print(f"p99 inter-token gap with bodies / without: {ratio:.2f}")
    bound = 1.5 * max(quiet) + 0.1
    print(
        f"longest gap with bodies {max(loaded):.2f} s, without {max(quiet):.2f} s: "
        f"{'within' if max(loaded) <= bound else 'over'} 1.5x without + 0.1 s = {bound:.2f} s (issue 27's target)"
    )
    typical = {k: statistics.median(v) for k, v in longest.items()}
    for arm, each in longest.items():
        print(f"longest gap of each decode, {arm}: {', '.join(f'{g:.2f}' for g in each)} s (median {typical[arm]:.2f})")
    print(
        f"median with bodies {typical[WITH]:.2f} s against 1.5x the median without + 0.1 s = "
        f"{1.5 * typical[WITHOUT] + 0.1:.2f} s"
    )
    print(f"p99 health-probe answer with bodies / without: {p(probes[WITH], 0.99) / p(probes[WITHOUT], 0.99):.2f}")
    print_cpu(cpu)


def print_cpu(cpu: dict[str, float]) -> None:
    print(
        "CPU per body with nothing decoding (one at a time): "
        + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in cpu.items())
    )


if __name__ == "__main__":
    main()
