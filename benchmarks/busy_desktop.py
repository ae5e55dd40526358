"""One stream's decode on a desktop whose other programs keep cores busy (runner/cpu_share.py).

    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/busy_desktop.py [--tokens 128] [--rounds 3] [--busy N]

Peers, on the Gemma 3 270M file from PyPI, the same chat messages, temperature 0, runs interleaved
(the order turns each round):
  lmsp-tray           this service as installed: its planned threads (one per physical core), fewer
                      while other programs use the CPUs (`YieldingThreads`)
  lmsp-tray fixed     the same with `threads = <cores>` set, as before the change (never yields)
  llama-server        llama.cpp's server built from the vendored sources, `-t <cores>`, `-np 1`
Each is measured on a quiet machine and beside `--busy` processes that spin (default: one fewer than
the logical CPUs, a desktop with one core left). Prints the CPU, medians and spreads of decode
tokens/s, and lmsp-tray / llama-server in each condition (target: >= 1.0 quiet, > 1.0 busy).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
from chat_completions import stream_chat
from common import (
    GEMMA_ID,
    cpu_line,
    gemma_path,
    llama_server_binary,
    llama_server_cpu_args,
    lmsp_service,
    physical_cores,
    print_table,
)
from throughput import llama_server, message

from lmsp_tray.runner.cpu_share import logical_cpus


@contextlib.contextmanager
def spinning(n: int) -> Iterator[None]:
    """`n` processes that keep a CPU busy each, as a build or a busy browser tab would."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0)  # the service reads the machine every half second
        yield
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
        time.sleep(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=max(1, logical_cpus() - 1))
    args = parser.parse_args()
    cores = physical_cores()
    model = gemma_path()
    print(f"CPU: {cpu_line()}")
    print(
        f"{logical_cpus()} logical CPUs, {cores} physical cores; {model.name}; {args.tokens} tokens; "
        f"{args.busy} busy process(es) in the busy condition; {args.rounds} interleaved rounds"
    )
    rates: dict[tuple[str, str], list[float]] = {}
    window = "context_cap = 8192\n"
    with (
        lmsp_service(model, threads=None, config=window) as (ours, _),
        lmsp_service(model, threads=cores, config=window) as (fixed, _),
        llama_server(llama_server_binary(), model, parallel=1, threads=cores, extra=llama_server_cpu_args()) as peer,
    ):
        peers = [
            ("lmsp-tray", ours.removesuffix("/lmsp/v1"), dict(ours.headers)),
            ("lmsp-tray fixed", fixed.removesuffix("/lmsp/v1"), dict(fixed.headers)),
            ("llama-server", peer, {}),
        ]
        for _, url, headers in peers:  # load and warm up
            with httpx.Client(timeout=600) as c:
                stream_chat(c, url, GEMMA_ID, message(0), 8, headers)
        for r in range(args.rounds):
            for condition, busy in (
                (("quiet", 0), ("busy", args.busy)) if r % 2 == 0 else (("busy", args.busy), ("quiet", 0))
            ):
                with spinning(busy):
                    turn = r % len(peers)
                    for name, url, headers in peers[turn:] + peers[:turn]:
                        with httpx.Client(timeout=600) as c:
                            sample = stream_chat(c, url, GEMMA_ID, message(r), args.tokens, headers)
                        rates.setdefault((name, condition), []).append(sample.decode_tps)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    def cell(name: str, condition: str) -> str:
        values = rates[(name, condition)]
        return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

    print_table(
        [(name, cell(name, "quiet"), cell(name, "busy")) for name, _, _ in peers],
        ("peer", "quiet tok/s", f"{args.busy} busy tok/s"),
    )
    for condition in ("quiet", "busy"):
        ours_median = statistics.median(rates[("lmsp-tray", condition)])
        theirs = statistics.median(rates[("llama-server", condition)])
        fixed_median = statistics.median(rates[("lmsp-tray fixed", condition)])
        per_round = ", ".join(
            f"{a / b:.2f}"
            for a, b in zip(rates[("lmsp-tray", condition)], rates[("llama-server", condition)], strict=True)
        )
        print(
            f"{condition}: lmsp-tray / llama-server {ours_median / theirs:.2f}x (rounds {per_round}); "
            f"/ lmsp-tray fixed {ours_median / fixed_median:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
