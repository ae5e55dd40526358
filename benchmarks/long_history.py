"""A long conversation continued turn by turn: time to first token once the history is in the KV cache.

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    .venv/bin/python benchmarks/long_history.py [--history-turns 48] [--turns 5]

Each peer first receives the same long history (about 6,000 tokens, untimed
warm-up: its KV cache then holds it), then the conversation goes on for
`--turns` turns, the whole history sent again each time with the peer's own
previous reply, 32 output tokens, temperature 0. Only the new turn needs
evaluating; what else a peer does with the long prompt shows in its time to
first token. Peers on the Gemma 3 270M file, same threads:
  lmsp-tray            POST /lmsp/v1/responses, streaming
  inproc               llama-cpp-python in-process (reuses its previous prompt's prefix)
  llama-server -np 1   llama.cpp's server, /completion streaming, --swa-full so it can reuse its cache
Prints the median TTFT per peer, the new prompt tokens, and how long tokenizing
the whole prompt takes (llama.cpp, in-process): the work lmsp-tray does not
redo for the part of a prompt it has seen.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import httpx
from common import (
    gemma_path,
    in_process_turn,
    llama_server_binary,
    lmsp_service,
    physical_cores,
    print_table,
)
from throughput import history_prompt, llama_server, lmsp_history_turn

USER = (
    "Here is part {i} of my notes on the old lighthouse: the keeper logs the weather at dawn, trims the wick, "
    "polishes the lens, writes letters to the mainland and watches the ships pass the reef at dusk."
)
ASSISTANT = (
    "Part {i} noted. The keeper's routine is steady: weather at dawn, the wick and the lens, letters, "
    "and the evening watch over the reef. Shall I keep collecting the parts and summarise them at the "
    "end, with the ships and the weather in separate lists?"
)


def history(turns: int) -> list[tuple[str, str]]:
    return [(USER.format(i=i + 1), ASSISTANT.format(i=i + 1)) for i in range(turns)]


def stream_llama_server(client: httpx.Client, url: str, prompt: str, tokens: int) -> tuple[float, str]:
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "cache_prompt": True, "stream": True}
    start = time.perf_counter()
    first = None
    text = []
    with client.stream("POST", f"{url}/completion", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: "):
                piece = json.loads(line[6:]).get("content", "")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    assert first is not None
    return first - start, "".join(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history-turns", type=int, default=48)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    binary = llama_server_binary()
    model = gemma_path()
    import llama_cpp

    llm = llama_cpp.Llama(str(model), n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    base = history(args.history_turns)
    questions = [f"Turn {t + 1} of today: what should the keeper do next, in one line?" for t in range(args.turns + 1)]
    ttft: dict[str, list[float]] = {"lmsp-tray": [], "inproc": [], "llama-server -np 1": []}
    fresh: dict[str, list[int]] = {name: [] for name in ttft}

    with contextlib.ExitStack() as stack:
        ours, _ = stack.enter_context(lmsp_service(model, threads=args.threads))
        ls = stack.enter_context(llama_server(binary, model, parallel=1, threads=args.threads, extra=["--swa-full"]))
        client = stack.enter_context(httpx.Client(timeout=900))

        def turn_ours(pairs: list[tuple[str, str]], q: str) -> tuple[float, str, int]:
            return lmsp_history_turn(client, ours, pairs, q)

        def turn_inproc(pairs: list[tuple[str, str]], q: str) -> tuple[float, str, int]:
            return in_process_turn(llm, history_prompt(pairs, q), 32)

        def turn_ls(pairs: list[tuple[str, str]], q: str) -> tuple[float, str, int]:
            seconds, text = stream_llama_server(client, ls, history_prompt(pairs, q), 32)
            return seconds, text, -1

        peers = {"lmsp-tray": turn_ours, "inproc": turn_inproc, "llama-server -np 1": turn_ls}
        convo = {name: list(base) for name in peers}
        for name, turn in peers.items():  # untimed: the long history goes into each peer's KV cache
            _, text, _ = turn(convo[name], questions[0])
            convo[name].append((questions[0], text))
        for q in questions[1:]:  # interleaved turns
            for name, turn in peers.items():
                seconds, text, new = turn(convo[name], q)
                ttft[name].append(seconds)
                fresh[name].append(new)
                convo[name].append((q, text))

    prompt = history_prompt(convo["inproc"][:-1], questions[-1])
    n_tokens = len(llm.tokenize(prompt.encode(), special=True))
    spent = []
    for _ in range(5):
        start = time.perf_counter()
        llm.tokenize(prompt.encode(), special=True)
        spent.append(time.perf_counter() - start)
    print(
        f"{model.name}, {args.threads} threads; history of {args.history_turns} turns, last prompt "
        f"{n_tokens} tokens; median of {args.turns} turns"
    )
    print_table(
        [
            (
                name,
                f"{statistics.median(v) * 1000:.0f}",
                f"{statistics.median(fresh[name]):.0f}" if fresh[name][0] >= 0 else "-",
            )
            for name, v in ttft.items()
        ],
        ("peer", "TTFT ms", "new prompt tokens"),
    )
    print(f"\ntokenizing the whole last prompt in llama.cpp: {statistics.median(spent) * 1000:.1f} ms")
    ours_ms, inproc_ms = statistics.median(ttft["lmsp-tray"]), statistics.median(ttft["inproc"])
    print(
        f"lmsp-tray TTFT / in-process: {ours_ms / inproc_ms:.2f}; "
        f"/ llama-server: {ours_ms / statistics.median(ttft['llama-server -np 1']):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
