"""No regression from speculative decoding on text that does not repeat its context.

    .venv/bin/python benchmarks/spec_regression.py [--rounds 3] [--tokens 160]

Free-form stories (the throughput benchmark's prompts), temperature 0, through two services on the
same Gemma file and threads: speculative decoding on (the default) and off. One stream, and four
at once (aggregate tokens/s), rounds interleaved; prints medians and on / off (targets >= 0.97),
and how many draft tokens were tried and kept per output token where the service says.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import time

import httpx
from common import gemma_path, lmsp_service, physical_cores, stream_lmsp
from throughput import message as story

PEERS = {"speculative on": "", "speculative off": "speculative = false\n"}


def four(url, tokens: int, round_: int) -> float:
    def one(i: int) -> int:
        with httpx.Client(timeout=600) as c:
            return stream_lmsp(c, url, story(round_ * 4 + i), tokens)[0].tokens

    start = time.perf_counter()
    with cf.ThreadPoolExecutor(4) as pool:
        total = sum(pool.map(one, range(4)))
    return total / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    args = parser.parse_args()
    model = gemma_path()
    threads = physical_cores()
    single: dict[str, list[float]] = {name: [] for name in PEERS}
    multi: dict[str, list[float]] = {name: [] for name in PEERS}
    with (
        lmsp_service(model, threads=threads, config=PEERS["speculative on"] + "parallel = 4\n") as (on, _),
        lmsp_service(model, threads=threads, config=PEERS["speculative off"] + "parallel = 4\n") as (off, _),
        httpx.Client(timeout=600) as c,
    ):
        urls = {"speculative on": on, "speculative off": off}
        for url in urls.values():
            stream_lmsp(c, url, story(0), 4)
        for r in range(args.rounds):
            for name, url in urls.items():
                single[name].append(stream_lmsp(c, url, story(r), args.tokens)[0].decode_tps)
                multi[name].append(four(url, args.tokens, r))
    print(f"Gemma 3 270M, {threads} threads, {args.rounds} rounds, {args.tokens} tokens, medians")
    for name in PEERS:
        print(
            f"{name:16s} single stream {statistics.median(single[name]):6.1f} tok/s   "
            f"4 streams {statistics.median(multi[name]):6.1f} tok/s"
        )
    ratio1 = statistics.median(a / b for a, b in zip(single["speculative on"], single["speculative off"], strict=True))
    ratio4 = statistics.median(a / b for a, b in zip(multi["speculative on"], multi["speculative off"], strict=True))
    print(f"on / off (paired medians): single stream {ratio1:.3f} (>= 0.97), 4 streams {ratio4:.3f} (>= 0.97)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
