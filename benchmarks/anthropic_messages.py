"""Anthropic's POST /v1/messages streaming: lmsp-tray against llama-server's own, 1 and 4 clients (issue 24).

    benchmarks/build_llama_server.sh            # once (~15 min on 2 cores; cached)
    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/anthropic_messages.py [--tokens 96] [--rounds 3] [--quick]

Both peers answer the same request on the same file: one user message (rendered by each server
with the file's chat template), `temperature: 0`, `max_tokens`, `stream: true`, read as Anthropic's
events (`content_block_delta` with `text_delta`; `usage.output_tokens` on `message_delta`). Decode
tokens/s counts the output tokens each server reports, after the first text. The rounds and the
peers' settings are `door_pair.py`'s. Targets: >= 1.0x llama-server at 1 and at 4 clients.
"""

from __future__ import annotations

import json
import sys
import time

import httpx
from common import GEMMA_ID, Sample
from door_pair import run


def stream_messages(client: httpx.Client, base: str, headers: dict[str, str], text: str, tokens: int) -> Sample:
    """One streamed /v1/messages: time to the first text delta, decode rate after it, output tokens."""
    body = {
        "model": GEMMA_ID,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    first = last = None
    deltas = 0
    count = None
    with client.stream(
        "POST", f"{base}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01", **headers}
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            kind = event.get("type")
            if kind == "content_block_delta" and event["delta"].get("type") == "text_delta" and event["delta"]["text"]:
                now = time.perf_counter()
                first = first or now
                last = now
                deltas += 1
            elif kind == "message_delta":
                count = (event.get("usage") or {}).get("output_tokens")
            elif kind == "error":
                raise RuntimeError(line)
    assert first is not None and last is not None, "no text streamed"
    count = count or deltas
    return Sample(first - start, (count - 1) / max(last - first, 1e-9), count)


if __name__ == "__main__":
    sys.exit(
        run(
            __doc__ or "",
            "lmsp-tray POST /v1/messages against llama-server POST /v1/messages (both streaming)",
            stream_messages,
            stream_messages,
        )
    )
