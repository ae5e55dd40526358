"""Does a huge grammar hold up everyone else? Running streams and a short request, with and without it.

    .venv/bin/python benchmarks/grammar_stall.py [--streams 3] [--tokens 128] [--rounds 3] [--values 12000]

lmsp-tray serves the Gemma 3 270M file (6 sequences, so nobody waits for a
slot). Each round runs the same thing twice, in alternating order:
`--streams` concurrent streaming responses (temperature 0, `--tokens` output
tokens each) and, once they flow, a short 2-token request from another
client — alone, and again right after a structured-output request whose JSON
Schema is one `enum` of `--values` distinct strings arrives. The grammar is
compiled before that request joins the batch and the enum compiles to a
prefix tree, so the short request should not wait for it.

Prints the streams' inter-token gaps (p50, p99) and the short request's
latency for both, and the short request's extra wait in decode steps (its
latency difference over the median gap; the issue's target: a step or two),
plus how long the enum request itself took.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import statistics
import string
import threading
import time

import httpx
from common import GEMMA_ID, gemma_path, lmsp_service, physical_cores, print_table
from throughput import message


def enum_values(n: int, seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rnd.choice(string.ascii_lowercase) for _ in range(rnd.randint(4, 12))))
    return sorted(out)


def stream_gaps(client: httpx.Client, url, i: int, tokens: int, flowing: threading.Event) -> list[float]:
    body = {"model": GEMMA_ID, "input": message(i), "stream": True, "temperature": 0, "max_output_tokens": tokens}
    gaps: list[float] = []
    last = None
    with client.stream("POST", f"{url}/responses", json=body, headers=url.headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line == "event: response.output_text.delta":
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                    if len(gaps) >= 3:
                        flowing.set()
                last = now
    return gaps


def timed_post(url, body: dict) -> float:
    start = time.perf_counter()
    r = httpx.post(f"{url}/responses", json=body, headers=url.headers, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - start


def run(url, streams: int, tokens: int, schema: dict | None) -> tuple[list[float], float, float | None]:
    short = {"model": GEMMA_ID, "input": "Say hi.", "temperature": 0, "max_output_tokens": 2}
    flowing = threading.Event()
    with httpx.Client(timeout=600) as client, cf.ThreadPoolExecutor(streams + 2) as pool:
        futures = [pool.submit(stream_gaps, client, url, i, tokens, flowing) for i in range(streams)]
        flowing.wait(120)
        big = None
        if schema is not None:
            body = {
                "model": GEMMA_ID,
                "input": "Pick one word.",
                "temperature": 0,
                "max_output_tokens": 24,
                "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema}},
            }
            big = pool.submit(timed_post, url, body)
            time.sleep(0.02)  # it arrives first
        short_latency = timed_post(url, short)
        gaps = [g for f in futures for g in f.result()]
        return gaps, short_latency, big.result() if big is not None else None


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--values", type=int, default=12_000)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    schema = {
        "type": "object",
        "properties": {"pick": {"enum": enum_values(args.values)}},
        "required": ["pick"],
    }
    print(f"{args.streams} streams x {args.tokens} tokens, a {args.values:,}-value enum, {args.rounds} rounds")
    print(f"schema: {len(json.dumps(schema)) / 1024:.0f} KiB")
    results: dict[str, list] = {"alone": [], "with enum": []}
    big_times: list[float] = []
    with lmsp_service(gemma_path(), threads=args.threads, config="parallel = 6\n") as (url, _proc):
        timed_post(url, {"model": GEMMA_ID, "input": "warm up", "max_output_tokens": 2})
        for rnd in range(args.rounds):
            order = ["alone", "with enum"] if rnd % 2 == 0 else ["with enum", "alone"]
            for name in order:
                gaps, short, big = run(url, args.streams, args.tokens, schema if name == "with enum" else None)
                results[name].append((gaps, short))
                if big is not None:
                    big_times.append(big)
    rows = []
    summary = {}
    for name, runs in results.items():
        gaps = [g for run_gaps, _ in runs for g in run_gaps]
        shorts = [s for _, s in runs]
        summary[name] = (statistics.median(gaps), pct(gaps, 0.99), statistics.median(shorts))
        p50, p99, short = summary[name]
        rows.append((name, f"{p50 * 1000:.1f} ms", f"{p99 * 1000:.1f} ms", f"{short * 1000:.0f} ms"))
    print_table(rows, ("run", "gap p50", "gap p99", "short request"))
    base_gap, base_p99, base_short = summary["alone"]
    _, with_p99, with_short = summary["with enum"]
    print(f"gap p99 with / without the enum: {with_p99 / base_p99:.2f} (target <= 1.2)")
    print(f"the short request waited {(with_short - base_short) / base_gap:+.1f} decode steps more (target: 1-2)")
    print(f"the enum request itself: median {statistics.median(big_times):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
