"""Embeddings throughput: short texts in batch requests of 32, on a generated BERT model.

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    .venv/bin/python benchmarks/embeddings.py [--texts 1000] [--rounds 3] [--quick]

Peers, each on the same generated BERT-architecture GGUF (MiniLM-L6-sized: 6 layers, 384 wide,
mean pooling; written with the `gguf` package into the bench cache), the same texts and thread
count, interleaved request by request (each request of 32 goes to every peer in turn):

  lmsp-tray                 POST /v1/embeddings over HTTP (the model in its model process)
  llama-server -np 32       llama.cpp's server, `--embeddings`, 32 slots (one per input of a request)
  llama-server (defaults)   `--embeddings` with its own slot count and batch sizes, as users start it
  llama-cpp-python          `Llama(embedding=True).embed(batch)` in this process (no HTTP)

Prints texts/s per peer (median over rounds) and lmsp-tray's ratio to each; target >= 1.0x
llama-server. Also checks that every peer gives the same vectors (cosine), so a fast wrong answer
cannot win.
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
from gguf_factory import BERT_WORDS, write_tiny_bert_gguf

BATCH = 32
Embedder = Callable[[list[str]], np.ndarray]


def bert_model() -> Path:
    path = CACHE / "bench-bert-384x6.gguf"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        write_tiny_bert_gguf(
            path, name="Bench Embed", basename="bench-embed", context_length=512, embedding=384, blocks=6,
            heads=6, ffn=1536, seed=7,
        )  # fmt: skip
    return path


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = [w for w in BERT_WORDS if w.isalpha()]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))) + "." for _ in range(n)]


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def over_http(url: str, model: str, headers: dict[str, str]) -> Embedder:
    client = httpx.Client(timeout=600, headers=headers)

    def embed(batch: list[str]) -> np.ndarray:
        r = client.post(f"{url}/v1/embeddings", json={"model": model, "input": batch, "encoding_format": "float"})
        r.raise_for_status()
        data = sorted(r.json()["data"], key=lambda d: d["index"])
        return np.array([d["embedding"] for d in data], dtype=np.float32)

    return embed


def run_round(
    peers: dict[str, Embedder], corpus: list[str], turn: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """One pass over the corpus for every peer, interleaved request by request (the order rotating),
    so that the shared machine's noise falls on every peer alike: texts/s and vectors per peer."""
    names = list(peers)
    spent = dict.fromkeys(names, 0.0)
    out: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for b, i in enumerate(range(0, len(corpus), BATCH)):
        batch = corpus[i : i + BATCH]
        shift = (b + turn) % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            vectors = peers[name](batch)
            spent[name] += time.perf_counter() - start
            out[name].append(vectors)
    return (
        {name: len(corpus) / spent[name] for name in names},
        {name: normalized(np.concatenate(out[name])) for name in names},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--quick", action="store_true", help="300 texts, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.texts, args.rounds = 300, 2
    binary = llama_server_binary()
    model = bert_model()
    corpus = texts(args.texts)
    import llama_cpp

    llm = llama_cpp.Llama(
        str(model), embedding=True, n_ctx=512, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads,
        verbose=False,
    )  # fmt: skip
    rates: dict[str, list[float]] = {}
    vectors: dict[str, np.ndarray] = {}
    with contextlib.ExitStack() as stack:
        url, _proc = stack.enter_context(lmsp_service(model, threads=args.threads))
        base = url.removesuffix("/lmsp/v1")
        model_id = next(m["id"] for m in httpx.get(f"{base}/v1/models", headers=url.headers, timeout=60).json()["data"])
        tuned = stack.enter_context(
            pooled_llama_server(binary, model, args.threads, "--embeddings", ["-np", "32", "-c", str(32 * 512)])
        )
        default = stack.enter_context(pooled_llama_server(binary, model, args.threads, "--embeddings", []))
        peers: dict[str, Embedder] = {
            "lmsp-tray": over_http(base, model_id, url.headers),
            "llama-server -np 32": over_http(tuned, "m", {}),
            "llama-server (defaults)": over_http(default, "m", {}),
            "llama-cpp-python in-process": lambda batch: np.array(llm.embed(batch), dtype=np.float32),
        }
        for embed in peers.values():
            embed(corpus[:BATCH])  # warm up: load the model, first allocations
        for r in range(args.rounds):
            round_rates, vectors = run_round(peers, corpus, r)
            for name, rate in round_rates.items():
                rates.setdefault(name, []).append(rate)
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s" for n in peers), flush=True)
    ours = statistics.median(rates["lmsp-tray"])
    print(f"\n{args.texts} texts in requests of {BATCH}, {args.threads} threads, {args.rounds} rounds (medians)")
    print(f"{'peer':30} {'texts/s':>9} {'lmsp-tray / peer':>17} {'min cosine vs lmsp-tray':>24}")
    for name, measured in rates.items():
        rate = statistics.median(measured)
        cosine = float((vectors[name] * vectors["lmsp-tray"]).sum(axis=1).min())
        print(f"{name:30} {rate:9.1f} {ours / rate:16.2f}x {cosine:24.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
