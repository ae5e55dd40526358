"""Do big request bodies stall the streams already running? Inter-token gaps with and without them.

    .venv/bin/python benchmarks/loop_stall.py [--streams 4] [--tokens 128] [--rounds 3] [--every 0.5] [--cpu-only]

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
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import os
import random
import statistics
import threading
import time

import httpx
from common import GEMMA_ID, children, cpu_seconds, gemma_path, lmsp_service, physical_cores, print_table
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


def run(url: str, headers: dict[str, str], args: argparse.Namespace, bodies: list[bytes] | None) -> tuple:
    """One decode of `args.streams` streams; with `bodies`, one arrives every `args.every` s until it ends.

    Returns the streams' inter-token gaps, the health probe's answer times and the bodies' answers."""
    start = threading.Barrier(args.streams + 1)
    answered: list[cf.Future] = []
    stop = threading.Event()
    with cf.ThreadPoolExecutor(args.streams + 1) as pool, cf.ThreadPoolExecutor(16) as senders:
        streams = [pool.submit(stream_gaps, url, headers, i, args.tokens, start) for i in range(args.streams)]
        start.wait()
        probes = pool.submit(probe, url, stop)
        k = 0
        while bodies and not all(f.done() for f in streams):
            answered.append(senders.submit(send, url, headers, bodies[k % len(bodies)]))
            k += 1
            cf.wait(streams, timeout=args.every)
        gaps = [g for f in streams for g in f.result()]
        stop.set()
    return gaps, probes.result(), [f.result() for f in answered]


def cpu_per_body(url: str, headers: dict[str, str], pid: int, bodies: list[bytes]) -> dict[str, float]:
    """The CPU time each process spends on one body, sent one after another with nothing decoding: the
    service (the interpreter whose lock relays every stream's tokens), the model process and the body
    worker. CPU seconds, unlike gaps, hardly depend on what else the machine runs. Gaps after these come
    from a warmer service: `main` runs this last."""
    send(url, headers, bodies[0])  # the body worker starts at the first big body (and is then kept)
    kids = children(pid)
    procs = {"service": pid}
    for kid, cmd in kids.items():
        if "lmsp_tray.runner.worker" in cmd:
            procs["model process"] = kid
        elif "multiprocessing" in cmd:
            procs["body worker"] = kid
    before = {name: cpu_seconds(k) for name, k in procs.items()}
    for raw in bodies:
        send(url, headers, raw)
    return {name: (cpu_seconds(k) - before[name]) / len(bodies) for name, k in procs.items()}


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1] if len(values) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between two bodies (default 0.5)")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--cpu-only", action="store_true", help="only the CPU time per body (no decode, no gaps)")
    args = ap.parse_args()

    bodies = [big_body(seed) for seed in range(4)]
    print(f"{len(bodies)} distinct bodies of {min(map(len, bodies)) / 2**20:.2f} MiB, one every {args.every} s")
    with lmsp_service(gemma_path(), threads=args.threads) as (url, service):
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
        quiet: list[float] = []
        loaded: list[float] = []
        probes: dict[bool, list[float]] = {False: [], True: []}
        answered: list = []
        longest: dict[bool, list[float]] = {False: [], True: []}  # each decode's longest gap
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for with_bodies in order:
                gaps, took, got = run(url, headers, args, bodies if with_bodies else None)
                (loaded if with_bodies else quiet).extend(gaps)
                probes[with_bodies].extend(took)
                longest[with_bodies].append(max(gaps))
                answered.extend(got)
                print(
                    f"round {r + 1} {'with bodies   ' if with_bodies else 'without bodies'}: {len(gaps)} gaps, "
                    f"p50 {p(gaps, 0.5) * 1000:.1f} ms, p99 {p(gaps, 0.99) * 1000:.1f} ms, "
                    f"max {max(gaps) * 1000:.1f} ms; probe p99 {p(took, 0.99) * 1000:.1f} ms"
                    + (f", {len(got)} bodies answered" if with_bodies else "")
                    + f"; load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        cpu = cpu_per_body(url, headers, service.pid, bodies * 2)
    rows = [
        (name, str(len(g)), f"{p(g, 0.5) * 1000:.1f}", f"{p(g, 0.99) * 1000:.1f}", f"{max(g) * 1000:.1f}")
        for name, g in (("without bodies", quiet), ("with 8 MiB bodies", loaded))
    ]
    rows += [
        (
            f"{name}: health probe",
            str(len(t)),
            f"{p(t, 0.5) * 1000:.1f}",
            f"{p(t, 0.99) * 1000:.1f}",
            f"{max(t) * 1000:.1f}",
        )
        for name, t in (("without bodies", probes[False]), ("with 8 MiB bodies", probes[True]))
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
    per_round = {k: ", ".join(f"{g:.2f}" for g in v) for k, v in longest.items()}
    typical = {k: statistics.median(v) for k, v in longest.items()}
    print(
        f"longest gap of each decode, without bodies: {per_round[False]} s; with: {per_round[True]} s. "
        f"Median with {typical[True]:.2f} s against 1.5x the median without + 0.1 s = "
        f"{1.5 * typical[False] + 0.1:.2f} s"
    )
    print(f"p99 health-probe answer with bodies / without: {p(probes[True], 0.99) / p(probes[False], 0.99):.2f}")
    print_cpu(cpu)


def print_cpu(cpu: dict[str, float]) -> None:
    print(
        "CPU per body with nothing decoding (one at a time): "
        + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in cpu.items())
    )


if __name__ == "__main__":
    main()
