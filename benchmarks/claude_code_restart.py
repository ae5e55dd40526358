"""Claude Code's second session after a service restart: time to first token on its fixed prefix (issue 24).

    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/claude_code_restart.py [--rounds 3] [--body captured.json]

Claude Code's request carries its system prompt and its tools (~20k tokens on Gemma's vocabulary
with Claude Code 2.1.197), the same in every session in the same folder except the hash in its
`x-anthropic-billing-header` line. The body is captured from Claude Code itself (the unmodified
release in tests/js, `claude -p "Say hi"` against a local recorder that answers like Anthropic), or
read from `--body`; then, on Gemma 3 270M (32k window, one sequence, the prompt cache on):

  cold          a fresh service's first request (model loaded before it): the whole prompt evaluated
  restarted     the service stopped (SIGTERM: its model saves its state) and started again, the model
                loaded, and a second session's request: a new billing hash and a new question
  same again    after one more restart, that second request once more (another billing stamp): the
                saved state ends where this prompt ends
  llama-server  `-np 1`, restarted, the same second-session request: it evaluates everything again
                (`--no-repack` where the CPU has AMX, as the service keeps its weights unrepacked)

Each round uses a fresh service home, so its cold request is cold. Prints the medians with their
spread and the ratio restarted / cold per round (target <= 0.05).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from common import (
    GEMMA_ID,
    ROOT,
    cpu_line,
    gemma_path,
    llama_server_binary,
    llama_server_cpu_args,
    physical_cores,
    print_table,
)
from resume import serve, service_home
from throughput import llama_server

CLAUDE = ROOT / "tests" / "js" / "node_modules" / ".bin" / "claude"
WINDOW = 32768
QUESTION = "Say hi"


def anthropic_reply(stream: bool, model: str) -> bytes:
    """A one-word answer in Anthropic's shape, streamed or not, so that Claude Code finishes its turn."""
    message = {
        "id": "msg_capture",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0},
    }
    if not stream:
        done = {**message, "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
        return json.dumps(done).encode()
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def capture_claude_code_body() -> dict[str, Any]:
    """Run Claude Code once against a recorder and return its main request (the one with tools)."""
    if not CLAUDE.exists():
        raise SystemExit(f"Claude Code is not installed ({CLAUDE}): npm ci --prefix tests/js, or give --body")
    bodies: list[dict[str, Any]] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            if self.path.startswith("/v1/messages/count_tokens"):
                payload, kind = b'{"input_tokens": 1}', "application/json"
            else:
                bodies.append(body)
                stream = bool(body.get("stream"))
                payload = anthropic_reply(stream, body.get("model", ""))
                kind = "text/event-stream" if stream else "application/json"
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    models = ("MODEL", "SMALL_FAST_MODEL", "DEFAULT_HAIKU_MODEL", "DEFAULT_SONNET_MODEL", "DEFAULT_OPUS_MODEL")
    try:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as work:
            env = {
                **os.environ,
                "HOME": home,
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
                "ANTHROPIC_AUTH_TOKEN": "capture",
                "ANTHROPIC_API_KEY": "",
                **{f"ANTHROPIC_{m}": GEMMA_ID for m in models},
                "CLAUDE_CODE_SUBAGENT_MODEL": GEMMA_ID,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
                "NO_COLOR": "1",
            }
            subprocess.run([str(CLAUDE), "-p", QUESTION], env=env, cwd=work, capture_output=True, timeout=300)
    finally:
        server.shutdown()
    main = [b for b in bodies if b.get("tools")]
    if not main:
        raise SystemExit(f"Claude Code sent no request with tools ({len(bodies)} requests)")
    return main[0]


def second_session(body: dict[str, Any]) -> dict[str, Any]:
    """The same folder's next session: a new billing stamp (`cc_version`'s fourth part, `cch=`) and a new
    question; the system prompt and the tools as they were."""
    again = json.loads(json.dumps(body))
    for block in again["system"] if isinstance(again["system"], list) else []:
        text = re.sub(r"cch=[^;]*;", "cch=5e55a;", block["text"])
        block["text"] = re.sub(r"(cc_version=\d+\.\d+\.\d+)\.[^;]*;", r"\1.9ab;", text)
    asked = 0
    for message in again["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "text" and block["text"] == QUESTION:
                block["text"], asked = "Say hello", asked + 1
    if asked != 1:
        raise SystemExit(f"the question {QUESTION!r} is not in the captured body once ({asked} times)")
    return again


def restamp(body: dict[str, Any]) -> dict[str, Any]:
    """The same request with another billing stamp, as Claude Code sends it again (a retry)."""
    again = json.loads(json.dumps(body))
    for block in again["system"] if isinstance(again["system"], list) else []:
        block["text"] = re.sub(r"(cc_version=\d+\.\d+\.\d+)\.[^;]*;", r"\1.c0d;", block["text"])
    return again


def for_gemma(body: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's body on the Gemma file: its model, a few answer tokens, greedy, streamed."""
    return {**body, "model": GEMMA_ID, "max_tokens": 8, "temperature": 0, "stream": True}


def first_token(c: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[float, dict]:
    """Time to the first content delta of a streamed /v1/messages, and the usage it reported."""
    start = time.perf_counter()
    first = None
    usage: dict = {}
    with c.stream("POST", f"{url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01", **headers}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("type") == "content_block_delta":
                first = first or time.perf_counter()
            elif event.get("type") == "message_start":
                usage.update(event["message"].get("usage") or {})
            elif event.get("type") == "message_delta":
                usage.update(event.get("usage") or {})
            elif event.get("type") == "error":
                raise RuntimeError(line)
    if first is None:  # nothing but a stop: the first token is the end of the message
        first = time.perf_counter()
    return first - start, usage


@contextlib.contextmanager
def loaded(home: Path, headers: dict[str, str]) -> Iterator[str]:
    """The service started in `home` with Gemma loaded; its root URL."""
    with serve(home, headers) as url, httpx.Client(timeout=900) as c:
        c.post(f"{url}/models/{GEMMA_ID}/load", headers=headers).raise_for_status()
        yield url.removesuffix("/lmsp/v1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--body", type=Path, help="a captured /v1/messages body (JSON) instead of running Claude Code")
    parser.add_argument("--save-body", type=Path, help="write the captured body here")
    parser.add_argument("--no-llama-server", action="store_true")
    args = parser.parse_args()
    captured = json.loads(args.body.read_text()) if args.body else capture_claude_code_body()
    if args.save_body:
        args.save_body.write_text(json.dumps(captured))
    first, second = for_gemma(captured), for_gemma(second_session(captured))
    model = gemma_path()
    binary = None if args.no_llama_server else llama_server_binary()
    cpu_args = llama_server_cpu_args()
    print(f"CPU: {cpu_line()}; {args.threads} threads")
    print(
        f"{model.name}; Claude Code's request: {len(json.dumps(captured['system']))} bytes of system, "
        f"{len(captured['tools'])} tools; window {WINDOW}; {args.rounds} round(s); llama-server "
        f"{' '.join(cpu_args) or '(no extra arguments)'}"
        + ("  [AMX: weights unrepacked on both sides]" if cpu_args else "")
    )
    config = f"context_cap = {WINDOW}\n"
    rows: dict[str, list[float]] = {
        "cold": [],
        "restarted": [],
        "same request again, restarted": [],
        "llama-server restarted": [],
    }
    with httpx.Client(timeout=900) as c:
        for r in range(args.rounds):
            with service_home(model, args.threads, config) as (home, headers):
                with loaded(home, headers) as url:
                    ttft, usage = first_token(c, url, headers, first)
                    rows["cold"].append(ttft)
                    print(f"round {r + 1}: cold {ttft:.2f} s, usage {usage}", flush=True)
                with loaded(home, headers) as url:
                    ttft, usage = first_token(c, url, headers, second)
                    rows["restarted"].append(ttft)
                    print(
                        f"round {r + 1}: second session after a restart {ttft * 1000:.0f} ms, usage {usage}", flush=True
                    )
                with loaded(home, headers) as url:  # the same request once more after one more restart
                    ttft, usage = first_token(c, url, headers, restamp(second))
                    rows["same request again, restarted"].append(ttft)
                    print(
                        f"round {r + 1}: the same request after a restart {ttft * 1000:.0f} ms, usage {usage}",
                        flush=True,
                    )
            if binary is not None:
                with llama_server(
                    binary, model, parallel=1, threads=args.threads, ctx_per_slot=WINDOW, extra=cpu_args
                ) as peer:
                    ttft, usage = first_token(c, peer, {}, second)
                    rows["llama-server restarted"].append(ttft)
                    print(f"round {r + 1}: llama-server restarted {ttft:.2f} s, usage {usage}", flush=True)
    table = [(name, f"{statistics.median(v):.3f}", f"{min(v):.3f}–{max(v):.3f}") for name, v in rows.items() if v]
    print_table(table, ("time to first token", "median s", "lowest–highest"))
    each = [w / c for w, c in zip(rows["restarted"], rows["cold"], strict=True)]
    print(
        f"second session after a restart / cold: {statistics.median(each):.3f} (target <= 0.05); rounds "
        + ", ".join(f"{x:.3f}" for x in each)
    )
    if rows["llama-server restarted"]:
        peer = [w / p for w, p in zip(rows["restarted"], rows["llama-server restarted"], strict=True)]
        print(f"second session after a restart / llama-server restarted: {statistics.median(peer):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
