"""One API of lmsp-tray against the same API of llama-server: 1 and 4 streaming clients, rounds interleaved.

Why a module of its own: `ollama_chat.py` and `anthropic_messages.py` (issue 24) measure two doors
the same way and differ only in how one stream is sent and read. Each gives two stream functions
(ours, the peer's); this runs them on the same Gemma file, the same messages, greedy, the same
thread count and an 8k window per sequence:

  lmsp-tray       one service for the whole run (4 sequences per model, `context_cap = 8192`)
  llama-server    started per round: -np 1 for the single stream, -np 4 for four clients;
                  `--no-repack` where the CPU has AMX, as the service keeps its weights unrepacked there

and prints medians with their spread (lowest–highest of the rounds' medians) and the ratios
lmsp-tray / llama-server per round. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from common import (
    Sample,
    cpu_line,
    gemma_path,
    llama_server_binary,
    llama_server_cpu_args,
    lmsp_service,
    physical_cores,
    print_table,
)
from throughput import llama_server, message

# (client, base URL, headers, message text, max tokens) -> one stream's sample
Stream = Callable[[httpx.Client, str, dict[str, str], str, int], Sample]
PEERS = ("lmsp-tray", "llama-server")


@dataclass
class Round:
    """One round's figures for one peer."""

    single: list[Sample] = field(default_factory=list)  # one client at a time
    aggregate: list[float] = field(default_factory=list)  # four clients: tokens/s over the wall time
    ttft4: list[float] = field(default_factory=list)  # four clients: each stream's time to first token


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--quick", action="store_true", help="1 round")
    return parser.parse_args()


def clients(stream: Stream, base: str, headers: dict[str, str], n: int, tokens: int) -> tuple[float, list[Sample]]:
    """n streams at once: aggregate tokens/s over the wall time, and each stream's sample."""
    start = time.perf_counter()

    def one(i: int) -> Sample:
        with httpx.Client(timeout=600) as c:
            return stream(c, base, headers, message(i), tokens)

    with cf.ThreadPoolExecutor(n) as pool:
        samples = list(pool.map(one, range(n)))
    return sum(s.tokens for s in samples) / (time.perf_counter() - start), samples


def race(title: str, ours: Stream, theirs: Stream, args: argparse.Namespace) -> dict[str, list[Round]]:
    """The interleaved rounds; returns each peer's rounds."""
    rounds = 1 if args.quick else args.rounds
    binary = llama_server_binary()
    model: Path = gemma_path()
    cpu_args = llama_server_cpu_args()
    print(f"{title}")
    print(f"CPU: {cpu_line()}; {args.threads} threads")
    print(
        f"{model.name}; {args.tokens} tokens a stream; {rounds} interleaved round(s); "
        f"llama-server {' '.join(cpu_args) or '(no extra arguments)'}"
        + ("  [AMX: weights unrepacked on both sides]" if cpu_args else "")
    )
    results: dict[str, list[Round]] = {name: [] for name in PEERS}
    with lmsp_service(model, threads=args.threads, config="context_cap = 8192\n") as (url, _):
        base = url.removesuffix("/lmsp/v1")
        auth = dict(url.headers)
        with httpx.Client(timeout=600) as c:
            ours(c, base, auth, message(0), 8)  # load and warm up
        for r in range(rounds):
            for name in PEERS:
                results[name].append(Round())
            with llama_server(binary, model, parallel=1, threads=args.threads, extra=cpu_args) as peer:
                with httpx.Client(timeout=600) as c:
                    theirs(c, peer, {}, message(0), 8)  # warm up
                for i in range(3):  # ABBA across rounds: drift in the machine's load hits both alike
                    pair = [("llama-server", theirs, peer, {}), ("lmsp-tray", ours, base, auth)]
                    for name, stream, where, headers in pair if (r + i) % 2 == 0 else pair[::-1]:
                        # A new connection each time: an idle pooled one may be closed under the next request.
                        with httpx.Client(timeout=600) as c:
                            results[name][-1].single.append(stream(c, where, headers, message(r + i), args.tokens))
            with llama_server(binary, model, parallel=4, threads=args.threads, extra=cpu_args) as peer:
                with httpx.Client(timeout=600) as c:
                    theirs(c, peer, {}, message(0), 8)
                pair = [("llama-server", theirs, peer, {}), ("lmsp-tray", ours, base, auth)]
                for name, stream, where, headers in pair + pair[::-1] if r % 2 == 0 else pair[::-1] + pair:
                    rate, samples = clients(stream, where, headers, 4, args.tokens)
                    results[name][-1].aggregate.append(rate)
                    results[name][-1].ttft4.extend(s.ttft for s in samples)
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return results


def spread(per_round: list[float], fmt: str = "{:.1f}") -> str:
    """The median of the rounds' figures with their lowest and highest."""
    return f"{fmt.format(statistics.median(per_round))} [{fmt.format(min(per_round))}–{fmt.format(max(per_round))}]"


def report(results: dict[str, list[Round]]) -> None:
    """Medians and spreads per peer, then the ratios lmsp-tray / llama-server per round and overall."""

    def figures(rounds: list[Round]) -> dict[str, list[float]]:
        return {
            "tps1": [statistics.median(s.decode_tps for s in x.single) for x in rounds],
            "ttft1": [statistics.median(s.ttft for s in x.single) * 1000 for x in rounds],
            "agg4": [statistics.median(x.aggregate) for x in rounds],
            "ttft4": [statistics.median(x.ttft4) * 1000 for x in rounds],
            "tokens": [float(s.tokens) for x in rounds for s in x.single],
        }

    fig = {name: figures(results[name]) for name in PEERS}
    rows = [
        (
            name,
            spread(f["tps1"]),
            spread(f["ttft1"], "{:.0f}"),
            spread(f["agg4"]),
            spread(f["ttft4"], "{:.0f}"),
            spread(f["tokens"], "{:.0f}"),
        )
        for name, f in fig.items()
    ]
    print("median of the rounds' medians [lowest–highest round]")
    print_table(
        rows,
        ("peer", "1 client tok/s", "1 client TTFT ms", "4 clients tok/s (sum)", "4 clients TTFT ms", "tokens a stream"),
    )
    ours, theirs = fig["lmsp-tray"], fig["llama-server"]

    def ratios(key: str) -> list[float]:
        return [a / b for a, b in zip(ours[key], theirs[key])]

    for key, label, target in (
        ("tps1", "decode, 1 client", " (target >= 1.0x)"),
        ("agg4", "decode, 4 clients (sum)", " (target >= 1.0x)"),
        ("ttft1", "TTFT, 1 client", " (lower is better)"),
        ("ttft4", "TTFT, 4 clients", " (lower is better)"),
    ):
        each = ratios(key)
        print(
            f"{label}: {statistics.median(each):.2f}x llama-server{target}; rounds "
            + ", ".join(f"{x:.2f}" for x in each)
        )


def run(doc: str, title: str, ours: Stream, theirs: Stream) -> int:
    args = parse_args(doc)
    report(race(title, ours, theirs, args))
    return 0
