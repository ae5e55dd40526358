"""Rerank throughput: query-document pairs in requests of 32, on a generated BERT-shaped reranker.

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    .venv/bin/python benchmarks/rerank.py [--pairs 1000] [--rounds 3] [--quick]

Peers, each on the same generated reranker GGUF (MiniLM-sized: 6 layers, 384 wide, `rank` pooling
with a classifier head, as bge-reranker; written with the `gguf` package into the bench cache), the
same query and documents and thread count, interleaved request by request (each request of 32
documents goes to every peer in turn):

  lmsp-tray                 POST /v1/rerank over HTTP (the model in its model process)
  llama-server -np 32       llama.cpp's server, `--reranking`, 32 slots (one per document of a request)
  llama-server (defaults)   `--reranking` with its own slot count and batch sizes, as users start it

Prints documents/s per peer (median over rounds) and lmsp-tray's ratio to each; target >= 1.0x
llama-server. Also checks that every peer gives the same scores, so a fast wrong answer cannot win.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from common import (
    CACHE,
    ROOT,
    llama_server_binary,
    lmsp_service,
    physical_cores,
    pooled_llama_server,
)

sys.path.insert(0, str(ROOT / "tests"))
from gguf_factory import BERT_WORDS, write_tiny_reranker_gguf

BATCH = 32
Ranker = Callable[[str, list[str]], np.ndarray]  # the scores of the documents, in their order


def rerank_model() -> Path:
    path = CACHE / "bench-rerank-384x6.gguf"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        write_tiny_reranker_gguf(
            path, name="Bench Rerank", basename="bench-rerank", context_length=512, embedding=384, blocks=6,
            heads=6, ffn=1536, seed=11,
        )  # fmt: skip
    return path


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [w for w in BERT_WORDS if w.isalpha()]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 24))) + "." for _ in range(n)]


def over_http(url: str, model: str, headers: dict[str, str]) -> Ranker:
    client = httpx.Client(timeout=600, headers=headers)

    def rank(query: str, documents: list[str]) -> np.ndarray:
        r = client.post(f"{url}/v1/rerank", json={"model": model, "query": query, "documents": documents})
        r.raise_for_status()
        scores = np.zeros(len(documents), dtype=np.float64)
        for item in r.json()["results"]:
            scores[item["index"]] = item["relevance_score"]
        return scores

    return rank


def run_round(
    peers: dict[str, Ranker], queries: list[str], documents: list[str], turn: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """One pass over the documents for every peer, interleaved request by request (the order rotating),
    so that the shared machine's noise falls on every peer alike: documents/s and scores per peer."""
    names = list(peers)
    spent = dict.fromkeys(names, 0.0)
    out: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for b, i in enumerate(range(0, len(documents), BATCH)):
        batch = documents[i : i + BATCH]
        query = queries[b % len(queries)]
        shift = (b + turn) % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            scores = peers[name](query, batch)
            spent[name] += time.perf_counter() - start
            out[name].append(scores)
    return (
        {name: len(documents) / spent[name] for name in names},
        {name: np.concatenate(out[name]) for name in names},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--quick", action="store_true", help="320 pairs, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.rounds = 320, 2
    binary = llama_server_binary()
    model = rerank_model()
    queries = sentences(8, seed=1)
    documents = sentences(args.pairs, seed=2)
    rates: dict[str, list[float]] = {}
    scores: dict[str, np.ndarray] = {}
    with contextlib.ExitStack() as stack:
        url, _proc = stack.enter_context(lmsp_service(model, threads=args.threads))
        base = url.removesuffix("/lmsp/v1")
        model_id = next(m["id"] for m in httpx.get(f"{base}/v1/models", headers=url.headers, timeout=60).json()["data"])
        tuned = stack.enter_context(
            pooled_llama_server(
                binary, model, args.threads, "--reranking", ["--no-repack", "-np", "32", "-c", str(32 * 512)]
            )
        )
        default = stack.enter_context(pooled_llama_server(binary, model, args.threads, "--reranking", ["--no-repack"]))
        peers: dict[str, Ranker] = {
            "lmsp-tray": over_http(base, model_id, url.headers),
            "llama-server -np 32": over_http(tuned, "m", {}),
            "llama-server (defaults)": over_http(default, "m", {}),
        }
        for rank in peers.values():
            rank(queries[0], documents[:BATCH])  # warm up: load the model, first allocations
        for r in range(args.rounds):
            round_rates, scores = run_round(peers, queries, documents, r)
            for name, rate in round_rates.items():
                rates.setdefault(name, []).append(rate)
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s" for n in peers), flush=True)
    ours = statistics.median(rates["lmsp-tray"])
    print(f"\n{args.pairs} query-document pairs in requests of {BATCH}, {args.threads} threads, {args.rounds} rounds")
    print(f"{'peer':30} {'documents/s':>12} {'lmsp-tray / peer':>17} {'max |score diff|':>17}")
    for name, measured in rates.items():
        rate = statistics.median(measured)
        diff = float(np.abs(scores[name] - scores["lmsp-tray"]).max())
        print(f"{name:30} {rate:12.1f} {ours / rate:16.2f}x {diff:17.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
