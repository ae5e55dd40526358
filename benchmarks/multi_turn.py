"""Multi-turn conversations: time to first token per turn, with and without KV prefix reuse.

    .venv/bin/python benchmarks/multi_turn.py [--turns 8] [--tokens 48] [--runs 3] [--model FILE]

One lmsp-tray service (a subprocess) on the Gemma 3 270M file, temperature 0.
(a) reuse: an 8-turn conversation through `previous_response_id` with
    `store: true`, starting on a freshly loaded model — the service expands
    the stored chain and the model's slot still holds the earlier turns in its
    KV cache, so only the new part of the prompt is evaluated;
(b) baseline: the same kind of conversation re-sending the whole context in
    `input`, with the model unloaded and loaded again (untimed) before every
    turn, so nothing is reused and the whole history is evaluated each time.
Prints, per turn, the median TTFT over the runs, the prompt size and how many
prompt tokens came from the cache, then the ratio turn N / turn 1 for each
series (target for reuse: ≤ 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import httpx
from common import GEMMA_ID, gemma_path, lmsp_service, physical_cores, print_table, stream_lmsp_turn

QUESTIONS = [
    "Tell me about a lighthouse keeper on a small island.",
    "What does she see from the lamp room at night?",
    "One morning she finds a bottle on the shore. What is inside?",
    "Who wrote the message, and why?",
    "How does she decide to answer it?",
    "Describe her journey across the sea.",
    "What happens when she arrives?",
    "How does the story end?",
    "Give the story a title.",
    "Summarise it in one sentence.",
]


def fresh_model(client: httpx.Client, url: str) -> None:
    """Unload and load the model (untimed): no KV cache holds any earlier conversation."""
    headers = getattr(url, "headers", None)  # the service's token (common.ServiceURL)
    client.post(f"{url}/models/{GEMMA_ID}/unload", headers=headers).raise_for_status()
    client.post(f"{url}/models/{GEMMA_ID}/load", headers=headers).raise_for_status()


def reuse_run(client: httpx.Client, url: str, turns: int, tokens: int) -> list[tuple[float, int, int]]:
    out = []
    previous = None
    fresh_model(client, url)  # turn 1 starts cold, like the baseline's turns
    for question in QUESTIONS[:turns]:
        extra = {"store": True, **({"previous_response_id": previous} if previous else {})}
        turn = stream_lmsp_turn(client, url, question, tokens, extra=extra)
        previous = turn.response_id
        cached = (turn.usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        out.append((turn.sample.ttft, turn.usage["input_tokens"], cached))
    return out


def baseline_run(client: httpx.Client, url: str, turns: int, tokens: int) -> list[tuple[float, int, int]]:
    out = []
    history: list[dict] = []
    for question in QUESTIONS[:turns]:
        fresh_model(client, url)  # nothing to reuse: the whole history is evaluated
        turn = stream_lmsp_turn(client, url, question, tokens, previous=history)
        history += [
            {"role": "user", "content": question},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": turn.text}]},
        ]
        cached = (turn.usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        out.append((turn.sample.ttft, turn.usage["input_tokens"], cached))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="max output tokens per turn")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--model", help="the Gemma 3 270M GGUF (default: assembled from the PyPI package)")
    args = parser.parse_args()
    turns = max(2, min(args.turns, len(QUESTIONS)))

    from pathlib import Path

    model = Path(args.model) if args.model else gemma_path()
    print(
        f"model {model.name}, {turns} turns, {args.tokens} output tokens per turn, {args.threads} threads, "
        f"{args.runs} runs (median per turn)"
    )
    reuse: list[list[tuple[float, int, int]]] = []
    base: list[list[tuple[float, int, int]]] = []
    with lmsp_service(model, threads=args.threads) as (url, _proc), httpx.Client(timeout=600) as client:
        stream_lmsp_turn(client, url, "Hello.", 4)  # warm-up: load the model
        for run in range(args.runs):
            pair = [(reuse, reuse_run), (base, baseline_run)]
            for series, fn in pair if run % 2 == 0 else pair[::-1]:
                series.append(fn(client, url, turns, args.tokens))

    def med(series: list[list[tuple[float, int, int]]], turn: int, field: int) -> float:
        return statistics.median(run[turn][field] for run in series)

    rows = []
    for t in range(turns):
        rows.append(
            (
                str(t + 1),
                f"{med(reuse, t, 0) * 1000:.0f}",
                f"{med(reuse, t, 1):.0f}",
                f"{med(reuse, t, 2):.0f}",
                f"{med(base, t, 0) * 1000:.0f}",
                f"{med(base, t, 1):.0f}",
                f"{med(base, t, 2):.0f}",
            )
        )
    print_table(
        rows, ("turn", "reuse TTFT ms", "prompt tok", "cached tok", "baseline TTFT ms", "prompt tok", "cached tok")
    )
    last = turns - 1
    ratio_reuse = med(reuse, last, 0) / med(reuse, 0, 0)
    ratio_base = med(base, last, 0) / med(base, 0, 0)
    print(
        f"\nturn {turns} / turn 1 TTFT: reuse {ratio_reuse:.2f}x (target <= 1.5x), "
        f"baseline without reuse {ratio_base:.2f}x"
    )
    print(
        f"turn {turns}: reuse is {med(base, last, 0) / med(reuse, last, 0):.1f}x faster to first token than "
        f"re-evaluating the whole context"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
