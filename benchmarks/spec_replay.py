"""Drafting policies compared on the very same text, priced by this machine's own kernels.

    .venv/bin/python benchmarks/spec_replay.py [--tokens 600] [--variants 3] [--reps 7] [--price 10,10]

Why: `edit_workload.py` runs the servers themselves, and its rounds swing for two reasons that have
nothing to do with how well a drafter drafts: the machine's load, and greedy texts that part from
one another at near-ties (each server's batch shapes round differently), so two servers often decode
different texts. This script takes both away. For each document of the edit workload it

1. decodes the greedy reference text in process (llama.cpp called directly, as `decode_ceiling.py`:
   one token a step, the same text llama-server gives without drafting);
2. measures what one `llama_decode` of `n` tokens after the first document's prompt, all with
   logits, costs on this machine (the verification of an `n - 1`-token draft; the median of
   `--reps`), for the sizes drafts take. llama-server's verifications run the same llama.cpp
   kernels: `verify_cost.cpp`, timing the same decodes built against llama-server's static build
   and against the service's libllama, gave the same times within run-to-run noise
   (`benchmarks/README.md`, 3 December 2026);
3. replays each drafter over the reference text: lmsp-tray's `PromptLookup` and `Drafting` (the
   service's own code, imported), llama.cpp's `ngram-simple` (12-token match, 48-token draft) and
   `ngram-mod` (24-token keys in a table shared across requests), each first asked and then asked
   again (lmsp-tray with its `Recent` sequences, `ngram-mod` with its table from the first), each
   step verifying its draft against the reference and keeping the agreeing prefix plus one token,
   as the servers do;
4. prices each replay with the measured costs: decode seconds, and tokens per second.

`--price FIXED_MS,TOKEN_MS` prices decodes on a line instead of measuring: another CPU's balance
between a step's fixed part and a token's cost (where a drafted token is dearer, as on a CPU with
fewer vector units, long drafts that overrun cost more). The step counts and the drafted and kept
tokens do not depend on the CPU; only this price does.

What it leaves out: each server's own per-step work around the decode (the service's Python
scheduler and relay, llama-server's C++ loop), which `edit_workload.py` measures end to end. What it
answers exactly: whose drafts cost fewer verification seconds on the same text on this CPU (AVX2 or
AVX-512), free of load and of parted texts.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp
from common import cpu_line, gemma_path, physical_cores, print_table
from decode_ceiling import Ceiling
from edit_workload import KINDS, messages, render

from lmsp_tray.runner.speculation import Drafting, PromptLookup, Recent

# Decode sizes timed (1 = a plain step); `Costs` interpolates below LINE_FROM and fits a line from it.
SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 49, 52, 56, 60, 62, 63, 64, 65)
LINE_FROM = 8  # from this many tokens on, a decode's cost is a line (fixed part + per token)
SIMPLE_MATCH, SIMPLE_DRAFT = 12, 48  # llama.cpp's ngram-simple defaults (common.h)
MOD_MATCH, MOD_MAX, MOD_MIN = 24, 64, 48  # ngram-mod's n_match, n_max, n_min
MOD_CHUNK = 32  # ngram-mod adds the output's n-grams to its table every this many tokens


@dataclass
class Replay:
    steps: int = 0
    drafted: int = 0
    kept: int = 0
    seconds: float = 0.0

    def rate(self, tokens: int) -> float:
        return tokens / self.seconds


class Costs:
    """Seconds for one decode of `n` tokens, all with logits: the measured median below `LINE_FROM`
    tokens, and from there a least-squares line through the measured sizes (each size's median
    alone swings by 10% between runs on a shared machine; the line through all of them does not)."""

    def __init__(self, measured: dict[int, float]) -> None:
        self.points = sorted(measured.items())
        big = [(n, t) for n, t in self.points if n >= LINE_FROM]
        mean_n = statistics.fmean(n for n, _ in big)
        mean_t = statistics.fmean(t for _, t in big)
        self.per_token = sum((n - mean_n) * (t - mean_t) for n, t in big) / sum((n - mean_n) ** 2 for n, _ in big)
        self.fixed = mean_t - self.per_token * mean_n

    def __call__(self, n: int) -> float:
        if n >= LINE_FROM:
            return self.fixed + self.per_token * n
        for (a, ca), (b, cb) in itertools.pairwise(self.points):
            if n <= b:
                return ca + (cb - ca) * (n - a) / (b - a)
        raise ValueError(n)


def measure_costs(ceiling: Ceiling, prompt: list[int], reps: int) -> Costs:
    """Time one decode of `n` tokens after `prompt` (sequence 0), each size `reps` times."""
    memory = llama_cpp.llama_get_memory(ceiling.ctx)
    llama_cpp.llama_memory_clear(memory, True)
    for at in range(0, len(prompt), 512):
        ceiling.decode([(t, at + i, 0, False) for i, t in enumerate(prompt[at : at + 512])])
    start = len(prompt)
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(reps):
        for n in SIZES:  # sizes interleaved, so a slow spell of the machine falls on all of them
            llama_cpp.llama_memory_seq_rm(memory, 0, start, -1)
            items = [(prompt[(i * 7) % len(prompt)], start + i, 0, True) for i in range(n)]
            t0 = time.perf_counter()
            ceiling.decode(items)
            ceiling.argmax(n - 1)
            times[n].append(time.perf_counter() - t0)
    llama_cpp.llama_memory_seq_rm(memory, 0, start, -1)
    return Costs({n: statistics.median(ts) for n, ts in times.items()})


def replay(
    out: list[int], cost: Costs, draft: Callable[[int], list[int]], told: Callable[[list[int], int], None]
) -> Replay:
    """Decode `out` (the reference) step by step: `draft(room)` proposes, the reference verifies, the
    agreeing prefix and one more token are kept; `told(emitted, proposed)` hears what each step
    emitted and how many tokens it had drafted."""
    r, i = Replay(), 1  # out[0] came from the prompt's evaluation
    while i < len(out):
        proposed = draft(len(out) - i - 1)
        kept = 0
        while kept < len(proposed) and proposed[kept] == out[i + kept]:
            kept += 1
        emitted = out[i : i + kept + 1]
        told(emitted, len(proposed))
        i += len(emitted)
        r.steps += 1
        r.drafted += len(proposed)
        r.kept += kept
        r.seconds += cost(1 + len(proposed))
    return r


def lmsp(prompt: list[int], out: list[int], cost: Costs, recent: Recent) -> Replay:
    """The service's prompt lookup, as its scheduler drives it for a stream decoding alone; the
    finished sequence goes into `recent`, where the same request asked again finds it."""
    lookup, drafting = PromptLookup([*prompt, out[0]], recent), Drafting()

    def draft(room: int) -> list[int]:
        if room <= 0:
            return []
        return lookup.draft(max(min(drafting.limit(), room), 0), room, loop=True)[:room]

    def told(emitted: list[int], proposed: int) -> None:
        drafting.record(proposed, len(emitted) - 1)
        for token in emitted:
            lookup.append(token)

    done = replay(out, cost, draft, told)
    recent.add(lookup)
    return done


def ngram_simple(prompt: list[int], out: list[int], cost: Costs) -> Replay:
    """llama.cpp's `common_ngram_simple_draft`: the last 12 tokens searched backwards in the history,
    the 48 after the latest match drafted (none when fewer than 12 follow it)."""
    history, last = list(prompt), [out[0]]
    n, m = SIMPLE_MATCH, SIMPLE_DRAFT

    def draft(room: int) -> list[int]:
        cur = len(history)
        if cur <= n + m + 1:
            return []
        pattern = history[cur - n + 1 :] + last
        for j in range(cur - n - 1, 0, -1):
            if history[j : j + n] == pattern:
                size = min(m, cur - (j + n))
                return history[j + n : j + n + size][:room] if size >= n else []
        return []

    def told(emitted: list[int], proposed: int) -> None:
        history.extend(last + emitted[:-1])
        last[:] = emitted[-1:]

    return replay(out, cost, draft, told)


class NgramMod:
    """llama.cpp's `ngram-mod`: a table from 24 tokens to the next, shared by requests (kept between
    them), filled with the prompt when a request begins and with the output every 32 tokens; a draft
    follows the table token by token, up to 64, and is dropped if shorter than 48. Five drafts in a
    row keeping under a quarter empty the table. (A dict stands for llama.cpp's 4M-entry hash table:
    no collisions, which at these sizes it has almost none of.)"""

    def __init__(self) -> None:
        self.table: dict[tuple[int, ...], int] = {}

    def run(self, prompt: list[int], out: list[int], cost: Costs) -> Replay:
        n, table = MOD_MATCH, self.table
        history, last = list(prompt), [out[0]]
        for i in range(len(prompt) - n):
            table[tuple(prompt[i : i + n])] = prompt[i + n]
        state = {"i_last": max(len(prompt) - n, 0), "low": 0, "drafted": 0}

        def draft(room: int) -> list[int]:
            cur = len(history)
            state["drafted"] = 0
            if cur < n:
                return []
            if state["i_last"] + MOD_CHUNK < cur:
                for i in range(state["i_last"], cur - n):
                    table[tuple(history[i : i + n])] = history[i + n]
                state["i_last"] = cur - n
            window = history[cur - n + 1 :] + last
            proposed: list[int] = []
            for i in range(MOD_MAX):
                token = table.get(tuple(window[i : i + n]))
                if token is None:
                    if i < MOD_MIN:
                        return []
                    break
                window.append(token)
                proposed.append(token)
            state["drafted"] = len(proposed)
            return proposed[:room]

        def told(emitted: list[int], proposed: int) -> None:
            if state["drafted"]:
                if (len(emitted) - 1) / state["drafted"] < 0.25:
                    state["low"] += 1
                    if state["low"] >= 5:
                        table.clear()
                        state["low"], state["i_last"] = 0, 0
                else:
                    state["low"] = 0
            history.extend(last + emitted[:-1])
            last[:] = emitted[-1:]

        return replay(out, cost, draft, told)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--variants", type=int, default=3, help="documents of each kind (as edit_workload.py)")
    parser.add_argument("--reps", type=int, default=7, help="timings of each decode size")
    parser.add_argument(
        "--price",
        metavar="FIXED_MS,TOKEN_MS",
        help="price decodes as FIXED_MS + TOKEN_MS per token instead of measuring (another CPU's balance)",
    )
    args = parser.parse_args()
    threads = physical_cores()
    print(f"CPU: {cpu_line()}; {threads} threads", flush=True)
    # What the loaded libllama was built for (`LLAMA_CPP_LIB_PATH` may name another build: an AVX2-only
    # one stands in for an AVX2 machine on this CPU).
    print(f"llama.cpp: {llama_cpp.llama_print_system_info().decode().strip()}", flush=True)
    ceiling = Ceiling(gemma_path(), streams=1, threads=threads)
    rows, ratios, again_ratios = [], [], []
    cost: Costs | None = None
    try:
        for variant in range(args.variants):
            for kind in KINDS:
                text = render(messages(variant)[kind])
                prompt = ceiling.tokenize(text)
                ceiling.run([text], args.tokens)
                out = ceiling.outputs[0]
                if len(out) < 2:
                    continue
                if cost is None and args.price:
                    fixed, token = (float(x) / 1e3 for x in args.price.split(","))
                    cost = Costs({n: fixed + token * n for n in SIZES})
                if cost is None:  # the documents' prompts are of one length (330-350 tokens): measured once
                    cost = measure_costs(ceiling, prompt, args.reps)
                plain = 1 / cost(1)
                mod, recent = NgramMod(), Recent()
                runs = {
                    "lmsp-tray": lmsp(prompt, out, cost, recent),
                    "ngram-simple": ngram_simple(prompt, out, cost),
                    "ngram-mod": mod.run(prompt, out, cost),
                    "lmsp-tray, asked again": lmsp(prompt, out, cost, recent),
                    "ngram-mod, asked again": mod.run(prompt, out, cost),
                }
                n = len(out) - 1
                for name, r in runs.items():
                    rows.append(
                        (
                            f"{kind} {variant}",
                            name,
                            str(r.steps),
                            f"{r.drafted}/{r.kept}",
                            f"{r.seconds:.2f} s",
                            f"{r.rate(n):.1f} tok/s",
                        )
                    )
                ours = runs["lmsp-tray"].rate(n)
                best = max(runs["ngram-simple"].rate(n), runs["ngram-mod"].rate(n))
                ratios.append(ours / best)
                again = runs["lmsp-tray, asked again"].rate(n)
                again_ratios.append(again / max(best, runs["ngram-mod, asked again"].rate(n)))
                costs = f"{cost(1) * 1e3:.1f} ms a step, {cost.fixed * 1e3:.1f} ms + {cost.per_token * 1e3:.2f} ms a token from {LINE_FROM}"
                rows.append(
                    (f"{kind} {variant}", f"(no drafts: {plain:.1f} tok/s; {costs})", "", "", "", f"{ours / best:.3f}x")
                )
                print(f"{kind} {variant}: {n} tokens, lmsp-tray / best llama.cpp n-gram {ours / best:.3f}", flush=True)
    finally:
        ceiling.close()
    print_table(rows, ("document", "drafter", "steps", "drafted/kept", "decode", "modelled rate"))
    print(
        f"lmsp-tray / best of ngram-simple and ngram-mod (first ask), median over documents: "
        f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]; "
        f"asked again (both keep what the first ask decoded), lmsp-tray / best with ngram-mod asked again "
        f"among them: {statistics.median(again_ratios):.3f} [{min(again_ratios):.3f}-{max(again_ratios):.3f}]"
    )


if __name__ == "__main__":
    main()
