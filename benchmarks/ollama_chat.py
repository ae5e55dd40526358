"""Ollama's POST /api/chat (NDJSON streaming) against llama-server's /v1/chat/completions, 1 and 4 clients (issue 24).

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/ollama_chat.py [--tokens 96] [--rounds 3] [--quick]

No Ollama binary is on the package registries, so the peer is llama-server's OpenAI chat endpoint
on the same file: the same messages (each server renders them with the file's chat template),
greedy (`options.temperature: 0` / `temperature: 0`), the same number of tokens
(`options.num_predict` / `max_tokens`). Decode tokens/s counts the tokens each server reports
(`eval_count` on Ollama's last line, `usage.completion_tokens`) after the first text. The rounds and
the peers' settings are `door_pair.py`'s. Targets: >= 1.0x llama-server at 1 and at 4 clients.
"""

from __future__ import annotations

import json
import sys
import time

import httpx
from chat_completions import stream_chat
from common import GEMMA_ID, Sample
from door_pair import run


def stream_ollama_chat(client: httpx.Client, base: str, headers: dict[str, str], text: str, tokens: int) -> Sample:
    """One streamed /api/chat: time to the first content, decode rate after it, `eval_count`."""
    body = {
        "model": GEMMA_ID,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "options": {"temperature": 0, "num_predict": tokens},
    }
    start = time.perf_counter()
    first = last = None
    count = 0
    with client.stream("POST", f"{base}/api/chat", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line:
                continue
            chunk = json.loads(line)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if (chunk.get("message") or {}).get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
            if chunk.get("done"):
                count = chunk["eval_count"]
    assert first is not None and last is not None, "no content streamed"
    return Sample(first - start, (count - 1) / max(last - first, 1e-9), count)


def stream_llama_chat(client: httpx.Client, base: str, headers: dict[str, str], text: str, tokens: int) -> Sample:
    return stream_chat(client, base, GEMMA_ID, text, tokens, headers)


if __name__ == "__main__":
    sys.exit(
        run(
            __doc__ or "",
            "lmsp-tray POST /api/chat (NDJSON) against llama-server POST /v1/chat/completions (SSE)",
            stream_ollama_chat,
            stream_llama_chat,
        )
    )
