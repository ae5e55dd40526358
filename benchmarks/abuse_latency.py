"""Does abuse slow the legitimate streams? Inter-token gaps and health probes with and without it.

    .venv/bin/python benchmarks/abuse_latency.py [--streams 4] [--tokens 128] [--rounds 2] [--quick]

lmsp-tray serves the Gemma 3 270M file. Each round runs the same 4-stream decode twice, in
alternating order: alone, and while three kinds of abuse run at once (issue 15):

- (a) `--slow` (1,000) connections held open: each trickles a request head a byte at a time and
  is opened again when the service closes it (the head deadline);
- (b) a new ~8 MiB body every `--every` seconds (a long conversation far over the context
  window: each is refused `400 context_length_exceeded` after reading, parsing and counting);
- (c) a structured-output request whose schema is one `enum` of 12,000 values, every 2 s.

Prints the streams' inter-token gaps (time between consecutive text deltas as the client receives
them) for both runs: p99 with abuse / p99 without (target <= 1.2), and the health probe (`GET
/lmsp/v1` every 20 ms): its slowest answer and how many took over 250 ms (target: none).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import socket
import statistics
import threading
import time
from urllib.parse import urlsplit

import httpx
from common import GEMMA_ID, gemma_path, lmsp_service, physical_cores, print_table
from loop_stall import big_body, p, probe, send, stream_gaps

ENUM_VALUES = 12_000
PROBE_LIMIT_S = 0.250


def slow_connections(url: str, count: int, stop: threading.Event, opened: list[int]) -> None:
    """Keep `count` connections open, each trickling a request head one byte per pass."""
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    head = b"GET /lmsp/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000
    socks: list[tuple[socket.socket, int]] = []

    def connect() -> tuple[socket.socket, int]:
        s = socket.create_connection((host, port), timeout=5)
        s.setblocking(False)
        opened[0] += 1
        return s, 0

    while len(socks) < count and not stop.is_set():
        try:
            socks.append(connect())
        except OSError:
            time.sleep(0.05)
    while not stop.wait(1.0):  # one byte per connection per second
        for i, (s, sent) in enumerate(socks):
            try:
                s.send(head[sent % len(head) : sent % len(head) + 1])
                socks[i] = (s, sent + 1)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # closed by the service's deadline: open another
                s.close()
                try:
                    socks[i] = connect()
                except OSError:
                    pass
    for s, _ in socks:
        s.close()


def enum_requests(url: str, headers: dict[str, str], stop: threading.Event, codes: dict[str, int]) -> None:
    schema = {"type": "string", "enum": [f"value-{i:05d}" for i in range(ENUM_VALUES)]}
    body = {
        "model": GEMMA_ID,
        "input": "Pick one.",
        "max_output_tokens": 4,
        "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema}},
    }
    with httpx.Client(timeout=600, headers=headers) as c:
        while not stop.is_set():
            r = c.post(f"{url}/responses", json=body)
            key = f"{r.status_code} {r.json().get('code', r.json().get('status'))}"
            codes[key] = codes.get(key, 0) + 1
            stop.wait(2.0)


def run(url: str, headers: dict[str, str], args: argparse.Namespace, abuse: bool) -> tuple:
    """One decode of `args.streams` streams, with or without the abuse; (gaps, probe times, abuse report)."""
    start = threading.Barrier(args.streams + 1)
    stop, quit_abuse = threading.Event(), threading.Event()
    opened = [0]
    enum_codes: dict[str, int] = {}
    answered: list[cf.Future] = []
    with cf.ThreadPoolExecutor(args.streams + 3) as pool, cf.ThreadPoolExecutor(8) as senders:
        kinds = {args.only} if args.only else {"slow", "bodies", "enum"}
        slow = enums = None
        if abuse and "slow" in kinds:
            slow = pool.submit(slow_connections, url, args.slow, quit_abuse, opened)
            while opened[0] < args.slow and not slow.done():
                time.sleep(0.1)  # all held open before the decode starts
        if abuse and "enum" in kinds:
            enums = pool.submit(enum_requests, url, headers, quit_abuse, enum_codes)
        streams = [pool.submit(stream_gaps, url, headers, i, args.tokens, start) for i in range(args.streams)]
        start.wait()
        probes = pool.submit(probe, url, stop)
        k = 0
        while abuse and "bodies" in kinds and not all(f.done() for f in streams):
            answered.append(senders.submit(send, url, headers, args.bodies[k % len(args.bodies)]))
            k += 1
            cf.wait(streams, timeout=args.every)
        gaps = [g for f in streams for g in f.result()]
        stop.set()
        quit_abuse.set()
        for f in (slow, enums):
            if f is not None:
                f.result()
    bodies: dict[str, int] = {}
    for status, code, _ in (f.result() for f in answered):
        bodies[f"{status} {code}"] = bodies.get(f"{status} {code}", 0) + 1
    return gaps, probes.result(), {"connections opened": opened[0], "bodies": bodies, "enum requests": enum_codes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--slow", type=int, default=1000, help="slow connections held open (default 1000)")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between two 8 MiB bodies (default 0.5)")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--quick", action="store_true", help="one round of 64 tokens (a shared machine)")
    ap.add_argument("--only", choices=("slow", "bodies", "enum"), help="one kind of abuse alone (to tell them apart)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.tokens = 1, 64
    args.bodies = [big_body(seed) for seed in range(2)]
    with lmsp_service(gemma_path(), threads=args.threads) as (url, _):
        headers = url.headers
        deadline = time.monotonic() + 60
        while httpx.post(f"{url}/models/{GEMMA_ID}/load", headers=headers, timeout=300).status_code == 404:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{GEMMA_ID} never appeared")
            time.sleep(0.2)
        run(url, headers, argparse.Namespace(**{**vars(args), "tokens": 16}), False)  # warm-up
        gaps: dict[bool, list[float]] = {False: [], True: []}
        probes: dict[bool, list[float]] = {False: [], True: []}
        longest: dict[bool, list[float]] = {False: [], True: []}  # each decode's longest gap
        for r in range(args.rounds):
            for abuse in [False, True] if r % 2 == 0 else [True, False]:
                got, took, report = run(url, headers, args, abuse)
                gaps[abuse].extend(got)
                longest[abuse].append(max(got))
                probes[abuse].extend(took)
                print(
                    f"round {r + 1} {'with abuse   ' if abuse else 'without abuse'}: {len(got)} gaps, "
                    f"p99 {p(got, 0.99) * 1000:.1f} ms; probe max {max(took) * 1000:.1f} ms"
                    + (f"; {report}" if abuse else ""),
                    flush=True,
                )
    rows = [
        (f"{'with' if abuse else 'without'} abuse: {what}", str(len(v)), *(f"{x * 1000:.1f}" for x in stats))
        for abuse in (False, True)
        for what, v in (("inter-token gap", gaps[abuse]), ("health probe", probes[abuse]))
        for stats in [(p(v, 0.5), p(v, 0.99), max(v))]
    ]
    print()
    print_table(rows, ("decode", "n", "p50 ms", "p99 ms", "max ms"))
    ratio = p(gaps[True], 0.99) / p(gaps[False], 0.99)
    over = sum(1 for t in probes[True] if t > PROBE_LIMIT_S)
    print(f"\np99 inter-token gap with abuse / without: {ratio:.2f} (target <= 1.2)")
    print(f"health probes over {PROBE_LIMIT_S * 1000:.0f} ms with abuse: {over} of {len(probes[True])} (target 0)")
    typical = {k: statistics.median(v) for k, v in longest.items()}
    bound = 1.5 * typical[False] + 0.1
    print(
        f"longest gap of each decode, without abuse: {', '.join(f'{g:.2f}' for g in longest[False])} s; with: "
        f"{', '.join(f'{g:.2f}' for g in longest[True])} s. Median with {typical[True]:.2f} s: "
        f"{'within' if typical[True] <= bound else 'over'} 1.5x the median without + 0.1 s = {bound:.2f} s "
        "(issue 27's target for big bodies: `--only bodies`)"
    )


if __name__ == "__main__":
    main()
