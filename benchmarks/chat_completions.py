"""Streaming chat completions against llama-server's /v1/chat/completions, 1 and 4 clients (issue 14).

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/chat_completions.py [--tokens 96] [--rounds 3] [--quick]

Peers, both on the Gemma 3 270M file from PyPI, the same messages (rendered by each server's own
chat template), temperature 0, the same thread count and an 8k window per sequence, runs interleaved:
  lmsp-tray       this service, POST /v1/chat/completions streaming (4 sequences per model)
  llama-server    llama.cpp's server built from the vendored sources: -np 1 for the single stream,
                  -np 4 for four clients at once
Prints medians (decode tokens/s of one stream, time to first token, aggregate tokens/s of four
streams) and the ratios against the targets: >= 0.95x single, >= 0.9x aggregate at 4.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import time

import httpx
from common import GEMMA_ID, Sample, gemma_path, llama_server_binary, lmsp_service, physical_cores, print_table
from throughput import llama_server, message


def stream_chat(client: httpx.Client, url: str, model: str, text: str, tokens: int, headers: dict) -> Sample:
    """One streamed chat completion: time to first content, decode rate after it, tokens (from usage)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    pieces = 0
    usage = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    pieces += 1
    assert first is not None and last is not None, "no content streamed"
    count = usage["completion_tokens"] if usage else pieces
    return Sample(first - start, (count - 1) / max(last - first, 1e-9), count)


def together(url: str, model: str, headers: dict, n: int, tokens: int) -> float:
    """n streams at once: aggregate tokens/s over the wall time."""
    start = time.perf_counter()

    def one(i: int) -> Sample:
        with httpx.Client(timeout=600) as c:
            return stream_chat(c, url, model, message(i), tokens, headers)

    with cf.ThreadPoolExecutor(n) as pool:
        samples = list(pool.map(one, range(n)))
    return sum(s.tokens for s in samples) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--quick", action="store_true", help="1 round")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    binary = llama_server_binary()
    model = gemma_path()
    print(
        f"machine: {os.cpu_count()} CPUs, {args.threads} threads; {model.name}; {args.tokens} tokens; "
        f"{rounds} interleaved round(s)"
    )
    single: dict[str, list[Sample]] = {"lmsp-tray": [], "llama-server": []}
    aggregate: dict[str, list[float]] = {"lmsp-tray": [], "llama-server": []}
    # The same window per sequence as the peer (the service would size a larger one from memory).
    with lmsp_service(model, threads=args.threads, config="context_cap = 8192\n") as (ours, _):
        base = ours.removesuffix("/lmsp/v1")
        headers = dict(ours.headers)
        with httpx.Client(timeout=600) as c:
            stream_chat(c, base, GEMMA_ID, message(0), 8, headers)  # load and warm up
        for r in range(rounds):
            with llama_server(binary, model, parallel=1, threads=args.threads) as peer:
                with httpx.Client(timeout=600) as c:
                    stream_chat(c, peer, GEMMA_ID, message(0), 8, {})  # warm up
                for i in range(3):  # ABBA order across rounds: drift in the machine's load hits both alike
                    pair = [("llama-server", peer, {}), ("lmsp-tray", base, headers)]
                    for name, url, auth in pair if (r + i) % 2 == 0 else pair[::-1]:
                        # A new connection each time: an idle pooled one may be closed under the next request.
                        with httpx.Client(timeout=600) as c:
                            single[name].append(stream_chat(c, url, GEMMA_ID, message(r + i), args.tokens, auth))
            with llama_server(binary, model, parallel=4, threads=args.threads) as peer:
                with httpx.Client(timeout=600) as c:
                    stream_chat(c, peer, GEMMA_ID, message(0), 8, {})
                pair = [("llama-server", peer, {}), ("lmsp-tray", base, headers)]
                for name, url, auth in pair + pair[::-1]:
                    aggregate[name].append(together(url, GEMMA_ID, auth, 4, args.tokens))
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)

    def med(name: str, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in single[name])

    rows = [
        (
            name,
            f"{med(name, 'decode_tps'):.1f}",
            f"{med(name, 'ttft') * 1000:.0f}",
            f"{statistics.median(aggregate[name]):.1f}",
        )
        for name in single
    ]
    print_table(rows, ("peer", "1 stream tok/s", "TTFT ms", "4 streams tok/s"))
    one = med("lmsp-tray", "decode_tps") / med("llama-server", "decode_tps")
    four = statistics.median(aggregate["lmsp-tray"]) / statistics.median(aggregate["llama-server"])
    print(f"single stream decode: {one:.2f}x llama-server (target >= 0.95x)")
    print(f"aggregate at 4 clients: {four:.2f}x llama-server (target >= 0.90x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
