"""Eight streams at once against `llama-server -np 8` on the same file (issue 27, target >= 1.2x).

    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/eight_streams.py [--rounds 5] [--tokens 96] [--peers 'lmsp-tray parallel 8']

Peers, all on the Gemma 3 270M file, temperature 0, the same thread count, one at a time:
  lmsp-tray            this service as users run it (its default: up to 4 sequences per model,
                       so the other four streams wait for a free one), speculative decoding on
  lmsp-tray parallel 8 the same with `parallel = 8`: all eight decoded together
  lmsp-tray parallel 8, speculative off   the same without drafts (what drafting costs or gains
                       when every step carries eight sequences)
  llama-server -np 8   llama.cpp's server, eight slots (`--no-repack` where the CPU has AMX)
  llama.cpp, no server the ceiling: the eight prompts prefilled and decoded greedy in one batch a step,
                       llama.cpp called directly (`decode_ceiling.py`): what no server beats without drafts
Each round starts eight stories at once on every peer (the order of peers rotates from round to
round) and measures the aggregate: output tokens of all eight over the wall time from the first
request to the last token. Each round asks for different stories (a topic per stream, a name per
round), so no peer answers a round from an earlier one. Prints each round's figures with the
load average, then the medians, the spread and the ratios per round, and the ceiling over llama-server:
the most any server can be ahead of it here without drafting. `--peers` runs only the peers named
(comma-separated; llama-server and the ceiling always).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    cpu_line,
    gemma_path,
    llama_server_binary,
    llama_server_cpu_args,
    lmsp_service,
    physical_cores,
    stream_lmsp,
    stream_openai_completion,
)
from decode_ceiling import Ceiling
from throughput import TOPICS, Runner, concurrent, llama_server, render

NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kalani", "Lior")
STREAMS = 8
CEILING = "llama.cpp, no server (ceiling)"
BASE = "llama-server -np 8"


def story(round_: int, i: int) -> str:
    who = NAMES[round_ % len(NAMES)]
    return (
        f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]} and a person called {who}. Describe every step."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--peers", default="", help="comma-separated peer names: only these")
    args = parser.parse_args()
    threads = physical_cores()
    model, binary = gemma_path(), llama_server_binary()
    print(
        f"CPU: {cpu_line()}; {threads} threads; {model.name}; {STREAMS} streams of {args.tokens} tokens; {args.rounds} rounds"
    )
    with contextlib.ExitStack() as stack:
        ours, _ = stack.enter_context(lmsp_service(model, threads=threads, config="keep_alive = '1h'\n"))
        ours8, _ = stack.enter_context(
            lmsp_service(model, threads=threads, config=f"parallel = {STREAMS}\nkeep_alive = '1h'\n")
        )
        ours8_plain, _ = stack.enter_context(
            lmsp_service(
                model, threads=threads, config=f"parallel = {STREAMS}\nspeculative = false\nkeep_alive = '1h'\n"
            )
        )
        server = stack.enter_context(
            llama_server(binary, model, parallel=STREAMS, threads=threads, extra=tuple(llama_server_cpu_args()))
        )
        ceiling = Ceiling(model, streams=STREAMS, threads=threads)
        stack.callback(ceiling.close)
        rnd = [0]  # the round being run: the prompts depend on it

        def lmsp(url: str) -> Runner:
            return lambda c, i, n: stream_lmsp(c, url, story(rnd[0], i), n)[0]

        peers: dict[str, Runner] = {
            "lmsp-tray": lmsp(ours),
            "lmsp-tray parallel 8": lmsp(ours8),
            "lmsp-tray parallel 8, speculative off": lmsp(ours8_plain),
            BASE: lambda c, i, n: stream_openai_completion(c, server, render(story(rnd[0], i)), n),
        }
        only = [phrase for phrase in args.peers.split(",") if phrase]
        peers = {name: run for name, run in peers.items() if name == BASE or not only or name in only}
        with httpx.Client(timeout=600) as c:  # warm-up: load, first prompt
            for run in peers.values():
                run(c, 0, 8)
        ceiling.run([render(story(0, i)) for i in range(STREAMS)], 8)
        rates: dict[str, list[float]] = {name: [] for name in [*peers, CEILING]}
        names = list(rates)
        for r in range(args.rounds):
            rnd[0] = r + 1
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if name == CEILING:
                    rate = ceiling.run([render(story(rnd[0], i)) for i in range(STREAMS)], args.tokens)
                else:
                    rate, _ = concurrent(peers[name], STREAMS, args.tokens)
                rates[name].append(rate)
                print(f"round {r + 1} {name:37s} {rate:6.1f} tok/s  load {os.getloadavg()[0]:.1f}", flush=True)
    for name, values in rates.items():
        per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(values, rates[BASE], strict=True))
        print(
            f"{name:37s} median {statistics.median(values):6.1f} tok/s [{min(values):.1f}-{max(values):.1f}]"
            f"  / {BASE} {statistics.median(values) / statistics.median(rates[BASE]):.2f} (per round {per_round})"
        )
    for name, values in rates.items():
        if name != CEILING:
            share = statistics.median(a / b for a, b in zip(values, rates[CEILING], strict=True))
            print(f"{name:37s} reaches {share:.2f} of the ceiling (median of rounds)")


if __name__ == "__main__":
    main()
