"""Does writing a saved prompt state slow a decode that runs meanwhile?

    .venv/bin/python benchmarks/save_stall.py [--rounds 6] [--tokens 160] [--saves 4]

The prompt cache copies a sequence's KV state out of the context only while no
request runs (a memory copy, on the scheduler thread), then writes it on its own
writer thread, in 2 MiB slices, each only while no request runs, at a low priority.
This measures the worst case: the engine (in process, the code a model process runs)
on Gemma 3 270M with two sequences; one holds a 48-turn conversation (about 5,400
tokens; the state written is its real one, ~24 MiB), the other streams a story,
temperature 0, speculation off. In alternate rounds `--saves` states are handed to
the writer just as the stream starts. Printed: inter-token gaps (median, p95, p99)
with and without the pending writes, their ratio (the target: p99 with writes <= 1.2x
without), how many states were written while the stream ran, and how long the
writes took to finish once it ended.
"""

from __future__ import annotations

import argparse
import itertools
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import GEMMA_PROMPT, ROOT, gemma_path, physical_cores
from long_history import history
from throughput import history_prompt

sys.path.insert(0, str(ROOT))

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.jobs import Finish, GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner import kv_states
from lmsp_tray.runner.model import LlamaModel
from lmsp_tray.runner.runtime import Runtime


def stream_gaps(model: LlamaModel, prompt: list[int], tokens: int) -> list[float]:
    """Seconds between consecutive deltas of one greedy stream (taken on the scheduler thread)."""
    stamps: list[float] = []
    done: queue.Queue = queue.Queue()

    def sink(item: object) -> None:
        if isinstance(item, Finish):
            done.put(item)
        else:
            stamps.append(time.perf_counter())

    model.submit(GenerationJob(prompt, SamplingParams(temperature=0.0), tokens, sink))
    done.get(timeout=600)
    return [b - a for a, b in itertools.pairwise(stamps)]  # from the first delta on: the prompt is not in them


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds (quiet, writing), interleaved")
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--saves", type=int, default=4, help="states handed to the writer per writing round")
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    path = gemma_path()
    with tempfile.TemporaryDirectory() as tmp:
        entry = ModelEntry("gemma", path, "custom", path.stat().st_size, (path,), read_gguf_info(path))
        opts = LoadOptions(
            threads=args.threads,
            parallel=2,
            context_cap=8192,
            speculative=False,
            prompt_cache_dir=tmp,
            prompt_cache_bytes=64 << 30,
        )
        model = LlamaModel(Runtime(), entry, opts)
        try:
            cache = model.prompt_cache
            assert cache is not None
            long = model.tokenize_prompt(history_prompt(history(48), "What next?"))
            stream_gaps(model, long, 2)  # one sequence now holds the conversation
            seq = next(s.seq_id for s in model.scheduler._slots if len(s.cache) > 1000)
            state = bytes(kv_states.copy_out(model.ctx, seq) or b"")
            print(f"conversation: {len(long)} tokens, state {len(state) / 2**20:.1f} MiB", flush=True)
            story = model.tokenize_prompt(GEMMA_PROMPT)
            quiet: list[float] = []
            writing: list[float] = []
            written = 0
            drained: list[float] = []
            for r in range(args.rounds):
                quiet += (q := stream_gaps(model, story, args.tokens))
                before = cache.saves
                names = [[random.randrange(1000, 200000) for _ in range(len(long))] for _ in range(args.saves)]
                threading.Timer(0.05, lambda names=names: [cache.save(t, state) for t in names]).start()
                writing += (w := stream_gaps(model, story, args.tokens))
                during = cache.saves - before
                start = time.perf_counter()
                cache.close()  # the model is idle now: the writes go through
                drained.append(time.perf_counter() - start)
                written += cache.saves - before
                for f in Path(tmp).rglob("*.kvstate"):
                    f.unlink()
                print(
                    f"round {r + 1}: p99 gap quiet {pct(q, 0.99) * 1000:.1f} ms, with {args.saves} saves pending "
                    f"{pct(w, 0.99) * 1000:.1f} ms; {during} written during the stream, the rest in "
                    f"{drained[-1] * 1000:.0f} ms after it",
                    flush=True,
                )
        finally:
            model.close()
    print(f"\n{'':24s} {'median':>8s} {'p95':>8s} {'p99':>8s}   (ms between tokens)")
    for name, gaps in (("no write", quiet), ("saves pending", writing)):
        row = [statistics.median(gaps), pct(gaps, 0.95), pct(gaps, 0.99)]
        print(f"{name:24s} " + " ".join(f"{v * 1000:8.1f}" for v in row))
    print(
        f"p99 while writing / without: {pct(writing, 0.99) / pct(quiet, 0.99):.2f} (<= 1.2); median "
        f"{statistics.median(writing) / statistics.median(quiet):.2f}; {written} states, "
        f"{written * len(state) / 2**20:.0f} MiB written in all"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
