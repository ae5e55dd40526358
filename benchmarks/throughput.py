"""Throughput side by side: single stream, 1/2/4/8 concurrent streams, and a 10-turn conversation.

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    .venv/bin/python benchmarks/throughput.py [--tokens 96] [--rounds 5] [--levels 1,2,4,8] [--quick]

Peers, all on the Gemma 3 270M file from PyPI, the same rendered prompts,
temperature 0 and the same thread count, runs interleaved:
  inproc        llama-cpp-python called in-process (single stream only)
  lmsp-tray     this service, POST /lmsp/v1/responses streaming (4 sequences per model)
  llama_cpp.server   python -m llama_cpp.server, /v1/completions streaming, as users run it
                     (its defaults), and again with our thread count
  llama-server -np 1 / -np 4   llama.cpp's server built from the vendored sources
Prints medians, then the target ratios of issue 6.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from common import (
    Sample,
    free_port,
    gemma_path,
    in_process_sample,
    in_process_turn,
    llama_cpp_server,
    llama_server_binary,
    lmsp_service,
    physical_cores,
    print_table,
    stream_lmsp,
    stream_lmsp_turn,
    stream_openai_completion,
    wait_http,
)

TOPICS = [
    "a lighthouse keeper",
    "a robot learning to paint",
    "a city under the sea",
    "a mountain village",
    "a lost satellite",
    "a night train",
    "an old library",
    "a desert caravan",
]


def message(i: int) -> str:
    return f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}. Describe every step."


def render(msg: str) -> str:
    return f"<start_of_turn>user\n{msg}<end_of_turn>\n<start_of_turn>model\n"


def history_prompt(history: list[tuple[str, str]], q: str) -> str:
    """A conversation's earlier (user, reply) turns and a new question, rendered as Gemma's template does."""
    return "".join(
        f"<start_of_turn>user\n{u}<end_of_turn>\n<start_of_turn>model\n{a}<end_of_turn>\n" for u, a in history
    ) + render(q)


def lmsp_history_turn(
    c: httpx.Client, url: str, history: list[tuple[str, str]], q: str, tokens: int = 32
) -> tuple[float, str, int]:
    """One turn through lmsp-tray with the whole history in `input`: TTFT, reply, newly evaluated tokens."""
    prev = [m for u, a in history for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})]
    t = stream_lmsp_turn(c, url, q, tokens, previous=prev)
    cached = (t.usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return t.sample.ttft, t.text, t.usage["input_tokens"] - cached


@contextlib.contextmanager
def llama_server(
    binary: Path,
    model: Path,
    *,
    parallel: int,
    threads: int,
    ctx_per_slot: int = 8192,
    extra: tuple[str, ...] | list[str] = (),
) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            "-m",
            str(model),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "-np",
            str(parallel),
            "-c",
            str(ctx_per_slot * parallel),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--no-webui",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


Runner = Callable[[httpx.Client, int, int], Sample]  # (client, prompt index, max tokens)


def concurrent(run: Runner, n: int, tokens: int) -> tuple[float, list[float]]:
    """n streams at once: aggregate tokens/s over the wall time, and each stream's TTFT."""
    start = time.perf_counter()

    def one(i: int) -> Sample:
        with httpx.Client(timeout=600) as c:
            return run(c, i, tokens)

    with cf.ThreadPoolExecutor(n) as pool:
        samples = list(pool.map(one, range(n)))
    wall = time.perf_counter() - start
    return sum(s.tokens for s in samples) / wall, [s.ttft for s in samples]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(q * (len(values) - 1))))
    return values[k]


Turn = Callable[[httpx.Client, list[tuple[str, str]], str], tuple[float, str, int]]


def conversation(turn: Turn, turns: int, offset: int = 0) -> tuple[list[float], list[int]]:
    """TTFT and newly evaluated prompt tokens of each turn of a conversation whose whole history
    is sent again every turn."""
    history: list[tuple[str, str]] = []
    ttfts, fresh = [], []
    with httpx.Client(timeout=600) as c:
        for t in range(turns):
            topic = TOPICS[(t + offset) % len(TOPICS)]
            question = f"Turn {t + 1}: continue the story about {topic} with a new twist."
            ttft, reply, new_tokens = turn(c, history, question)
            ttfts.append(ttft)
            fresh.append(new_tokens)
            history.append((question, reply))
    return ttfts, fresh


def median_turns(runs: list[list[float]]) -> list[float]:
    return [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round, concurrency 1 and 4 only")
    parser.add_argument("--levels", default="1,2,4,8", help="concurrency levels (must include 4)")
    args = parser.parse_args()
    levels = [1, 4] if args.quick else [int(n) for n in args.levels.split(",")]
    rounds = 1 if args.quick else args.rounds
    binary = llama_server_binary()
    model = gemma_path()
    import llama_cpp

    print(
        f"machine: {os.cpu_count()} CPUs, {args.threads} threads; {model.name}; {args.tokens} tokens; "
        f"{rounds} interleaved round(s)"
    )
    llm = llama_cpp.Llama(str(model), n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)

    with contextlib.ExitStack() as stack:
        ours, _ = stack.enter_context(lmsp_service(model, threads=args.threads))
        lcs = stack.enter_context(llama_cpp_server(model, threads=None))  # as users run it
        lcs_eq = stack.enter_context(llama_cpp_server(model, threads=args.threads))
        ls1 = stack.enter_context(llama_server(binary, model, parallel=1, threads=args.threads))
        ls4 = stack.enter_context(llama_server(binary, model, parallel=4, threads=args.threads))

        def run_ours(c: httpx.Client, i: int, n: int) -> Sample:
            return stream_lmsp(c, ours, message(i), n)[0]

        def run_oai(url: str) -> Runner:
            return lambda c, i, n: stream_openai_completion(c, url, render(message(i)), n)

        peers: dict[str, Runner] = {
            "lmsp-tray": run_ours,
            "llama_cpp.server": run_oai(lcs),
            "llama_cpp.server same threads": run_oai(lcs_eq),
            "llama-server -np 1": run_oai(ls1),
            "llama-server -np 4": run_oai(ls4),
        }
        with httpx.Client(timeout=600) as c:  # warm-up
            for run in peers.values():
                run(c, 0, 8)
            in_process_sample(llm, render(message(0)), 8)

        single: dict[str, list[Sample]] = {name: [] for name in ["inproc", *peers]}
        conc: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
        for r in range(rounds):
            names = list(single)
            names = names[r % len(names) :] + names[: r % len(names)]
            with httpx.Client(timeout=600) as c:
                for _ in range(2):  # two single-stream samples per peer and round
                    for name in names:
                        if name == "inproc":
                            single[name].append(in_process_sample(llm, render(message(r)), args.tokens))
                        else:
                            single[name].append(peers[name](c, r, args.tokens))
            for n in levels:
                for name in [x for x in names if x != "inproc"]:
                    conc.setdefault((name, n), []).append(concurrent(peers[name], n, args.tokens))

        print("\nsingle stream (median)")
        rows = [
            (
                name,
                f"{statistics.median(s.decode_tps for s in v):.1f}",
                f"{statistics.median(s.ttft for s in v) * 1000:.0f}",
            )
            for name, v in single.items()
        ]
        print_table(rows, ("peer", "decode tok/s", "TTFT ms"))

        print("\nconcurrent streams (median of rounds; TTFT percentiles over all streams)")
        rows = []
        for (name, n), results in sorted(conc.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            agg = statistics.median(a for a, _ in results)
            ttfts = [t for _, ts in results for t in ts]
            rows.append((f"{n}", name, f"{agg:.1f}", f"{pct(ttfts, 0.5) * 1000:.0f}", f"{pct(ttfts, 0.95) * 1000:.0f}"))
        print_table(rows, ("streams", "peer", "aggregate tok/s", "p50 TTFT ms", "p95 TTFT ms"))

        print(
            f"\n{args.turns}-turn conversation, whole history re-sent each turn "
            f"(TTFT ms per turn, median of {args.conversations} conversations)"
        )

        def turn_ours(c: httpx.Client, history: list[tuple[str, str]], q: str) -> tuple[float, str, int]:
            return lmsp_history_turn(c, ours, history, q)

        def turn_llama_server(c: httpx.Client, history: list[tuple[str, str]], q: str) -> tuple[float, str, int]:
            r = c.post(
                f"{ls1}/completion",
                json={
                    "prompt": history_prompt(history, q),
                    "n_predict": 32,
                    "temperature": 0,
                    "cache_prompt": True,
                    "stream": False,
                },
            )
            r.raise_for_status()
            timings = r.json()["timings"]
            return (
                (timings["prompt_ms"] + timings["predicted_per_token_ms"]) / 1000,
                r.json()["content"],
                timings["prompt_n"],
            )

        def turn_inproc(c: httpx.Client, history: list[tuple[str, str]], q: str) -> tuple[float, str, int]:
            # llama-cpp-python keeps its last prompt's KV and evaluates only what differs: the engine's own
            # cost for the same new tokens at the same context length, with no server around it.
            return in_process_turn(llm, history_prompt(history, q), 32)

        runs: dict[str, list[tuple[list[float], list[int]]]] = {"ours": [], "inproc": [], "ls": []}
        for k in range(args.conversations):  # interleaved; medians per turn
            runs["ours"].append(conversation(turn_ours, args.turns, offset=k))
            runs["inproc"].append(conversation(turn_inproc, args.turns, offset=k))
            runs["ls"].append(conversation(turn_llama_server, args.turns, offset=k))
        turns = {name: median_turns([r[0] for r in rs]) for name, rs in runs.items()}
        fresh = {name: median_turns([r[1] for r in rs]) for name, rs in runs.items()}
        print_table(
            [
                (str(i + 1), *(f"{turns[name][i] * 1000:.0f} ({fresh[name][i]:.0f})" for name in runs))
                for i in range(args.turns)
            ],
            ("turn", "lmsp-tray", "llama-cpp-python in-process", "llama-server -np 1 (server timing)"),
        )
        print("  (new prompt tokens evaluated in brackets)")
        ours_turns, inproc_turns, ls_turns = turns["ours"], turns["inproc"], turns["ls"]

    def med(name: str, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in single[name])

    def agg(name: str, n: int) -> float:
        return statistics.median(a for a, _ in conc[(name, n)])

    def p95(name: str, n: int) -> float:
        return pct([t for _, ts in conc[(name, n)] for t in ts], 0.95)

    print("\ntargets")
    checks = [
        (
            "single stream vs llama-server -np 1 (>= 0.95)",
            med("lmsp-tray", "decode_tps") / med("llama-server -np 1", "decode_tps"),
            0.95,
        ),
        ("single stream vs in-process (>= 1.0)", med("lmsp-tray", "decode_tps") / med("inproc", "decode_tps"), 1.0),
        ("4 streams vs llama-server -np 4 aggregate (>= 0.9)", agg("lmsp-tray", 4) / agg("llama-server -np 4", 4), 0.9),
        ("4 streams vs llama_cpp.server aggregate (>= 2.5)", agg("lmsp-tray", 4) / agg("llama_cpp.server", 4), 2.5),
        (
            "  (info: llama_cpp.server given our threads)",
            agg("lmsp-tray", 4) / agg("llama_cpp.server same threads", 4),
            None,
        ),
        ("4 streams p95 TTFT / llama-server's (<= 2.0)", p95("lmsp-tray", 4) / p95("llama-server -np 4", 4), -2.0),
        ("turn 10 TTFT / turn 1 (<= 1.5)", ours_turns[-1] / ours_turns[0], -1.5),
        (
            "  (info: turn 10 / turn 2, about as many new prompt tokens: the cost of the longer history)",
            ours_turns[-1] / ours_turns[1],
            None,
        ),
        (
            "  (info: llama-cpp-python in-process turn 10 / turn 1: the engine alone, same new tokens)",
            inproc_turns[-1] / inproc_turns[0],
            None,
        ),
        ("  (info: turn 10 TTFT vs llama-cpp-python in-process turn 10)", ours_turns[-1] / inproc_turns[-1], None),
        ("  (info: llama-server -np 1 turn 10 / turn 1, its own timing)", ls_turns[-1] / ls_turns[0], None),
    ]
    for label, value, target in checks:
        if target is None:
            print(f"  {label}: {value:.2f}")
            continue
        ok = value >= target if target > 0 else value <= -target
        print(f"  {label}: {value:.2f} {'ok' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
