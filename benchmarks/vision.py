"""Images: time to first token of an image + prompt, against llama-server --mmproj, and a follow-up turn (issue 25).

    LMSP_BENCH_CACHE=... .venv/bin/python benchmarks/vision.py [--rounds 5] [--model FILE --mmproj FILE]

Both servers get the same model, projector, images and prompts, on the same threads, one sequence,
temperature 0, streamed over `POST /v1/chat/completions`. Without `--model` a tiny generated pair is
used (`tests/gguf_factory.write_tiny_vision_pair`: a 224 px projector, 784 image tokens).
(a) first turn: a new image each round (nothing to reuse: the image is encoded and evaluated);
(b) follow-up: the same conversation re-sent with the answer and a new question (the image's KV is
    reused by lmsp-tray; llama-server reuses its slot's cache when it holds the same image).
Targets: lmsp-tray's first-turn TTFT <= 1.1x llama-server's; its follow-up <= 0.2x its own first turn.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from common import ROOT, cpu_line, free_port, llama_server_binary, llama_server_cpu_args, lmsp_service, wait_http
from PIL import Image

PROMPT = "Describe the image in one sentence."
# The earlier answer sent back in the follow-up: the same fixed text for both servers.
ANSWER = "It is a picture of coloured noise."
FOLLOW_UP = "And what colours does it have?"


def image_url(seed: int) -> str:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def ttft(client: httpx.Client, url: str, model: str, messages: list, headers: dict) -> tuple[float, str]:
    """Seconds to the first streamed content and the whole answer (8 tokens)."""
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = None
    text = ""
    # A connection of its own each time: llama-server closes a kept-alive connection after a stream,
    # and the next request on it would fail.
    with client.stream("POST", url, json=body, headers={**headers, "Connection": "close"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if delta and first is None:
                first = time.perf_counter() - started
            text += delta
    return (first if first is not None else time.perf_counter() - started), text


def conversation(url: str, answer: str | None) -> list:
    content = [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": url}}]
    messages: list = [{"role": "user", "content": content}]
    if answer is not None:
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]
    return messages


def run(client: httpx.Client, url: str, model: str, headers: dict, rounds: int, seed: int) -> tuple[list, list]:
    firsts, follows = [], []
    ttft(client, url, model, conversation(image_url(seed - 1), None), headers)  # warm-up (untimed)
    for i in range(rounds):
        image = image_url(seed + i)
        first, _ = ttft(client, url, model, conversation(image, None), headers)
        follow, _ = ttft(client, url, model, conversation(image, ANSWER), headers)
        firsts.append(first)
        follows.append(follow)
    return firsts, follows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--mmproj", type=Path)
    args = parser.parse_args()
    print(cpu_line())
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            sys.path.insert(0, str(ROOT / "tests"))
            from gguf_factory import write_tiny_vision_pair

            model, projector = write_tiny_vision_pair(Path(tmp))
        else:
            model, projector = args.model, args.mmproj
        results = {}
        with (
            lmsp_service(model, threads=args.threads, beside=(projector,)) as (lmsp, _),
            httpx.Client(timeout=300) as c,
        ):
            models = c.get(f"{lmsp}/models", headers=lmsp.headers).json()["data"]
            model_id = next(m["id"] for m in models if "image" in m["extensions"]["lmsp_tray"]["input_modalities"])
            base = lmsp.removesuffix("/lmsp/v1")
            results["lmsp-tray"] = run(c, f"{base}/v1/chat/completions", model_id, lmsp.headers, args.rounds, 100)
        port = free_port()
        cmd = [str(llama_server_binary()), "-m", str(model), "--mmproj", str(projector), "--port", str(port)]
        cmd += ["-t", str(args.threads), "-tb", str(args.threads), "-np", "1", "-c", "8192", *llama_server_cpu_args()]
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as server:
            try:
                wait_http(f"http://127.0.0.1:{port}/health")
                with httpx.Client(timeout=300) as c:
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    results["llama-server"] = run(c, url, model.name, {}, args.rounds, 100)
            finally:
                server.terminate()
                server.wait(30)
    print(f"{'server':<14}{'first turn TTFT (median)':>26}{'follow-up TTFT (median)':>26}{'follow/first':>14}")
    med = {name: (statistics.median(f), statistics.median(g)) for name, (f, g) in results.items()}
    for name, (first, follow) in med.items():
        print(f"{name:<14}{first * 1000:>23.1f} ms{follow * 1000:>23.1f} ms{follow / first:>14.2f}")
    ratio = med["lmsp-tray"][0] / med["llama-server"][0]
    print(f"first turn: lmsp-tray / llama-server = {ratio:.2f} (target <= 1.1)")
    print(f"follow-up: lmsp-tray follow / first = {med['lmsp-tray'][1] / med['lmsp-tray'][0]:.2f} (target <= 0.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
