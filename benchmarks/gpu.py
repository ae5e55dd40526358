"""lmsp-tray against llama-server on the same GPU: decode at 1 and 4 streams, time to first token, a 5k-token prompt.

    .venv/bin/python benchmarks/gpu.py [--model FILE] [--rounds 5] [--tokens 128] [--prompt-tokens 5000]

Both peers run llama.cpp built with the same backend from the same sources: lmsp-tray with the
venv's llama-cpp-python (installers/install.py built it for this machine's GPU), llama-server from
the llama.cpp that llama-cpp-python vendors (`build_llama_server.sh static <backend>`: built once,
cached per backend). Both get every layer on the GPU (llama-server `-ngl 99`, lmsp-tray's planner
when the model fits; the service document's devices are printed), the same model, the same chat
messages through the model's own template, temperature 0; one peer after the other (one GPU holds one
at a time). Prints medians and
the ratios lmsp-tray / llama-server (targets: >= 0.95 on each), and the device's name.

On a machine without a GPU, lavapipe (Mesa's Vulkan on the CPU) makes the script run end to end
with a Vulkan build: `GGML_VK_VISIBLE_DEVICES=0` (llama.cpp skips CPU-type devices otherwise).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import ROOT, Sample, gemma_path, lmsp_service, physical_cores, print_table, stream_lmsp_turn
from throughput import llama_server

TOPICS = ("a lighthouse keeper", "a robot learning to paint", "a city under the sea", "a night train")
FILLER = (
    "The harbour master wrote down the tide, the wind and the colour of the sky for day {i}, "
    "and noted which boats went out, which came back, and what each of them had caught. "
)


def build_backend() -> str:
    """The backend the venv's llama.cpp was built with, from its libraries (cpu when none)."""
    spec = importlib.util.find_spec("llama_cpp")
    lib = Path(spec.origin).parent / "lib" if spec and spec.origin else None
    for backend in ("cuda", "vulkan", "metal", "hip", "sycl"):
        if lib is not None and any(lib.glob(f"libggml-{backend}.*")):
            return backend
    return "cpu"


def llama_server_for(backend: str) -> Path:
    """llama-server built with `backend` from the vendored sources (Vulkan: with the installer's headers)."""
    env = dict(os.environ)
    if backend == "vulkan" and sys.platform == "linux":
        sys.path.insert(0, str(ROOT / "installers"))
        from llama_wheel import vulkan_include_args  # the same headers the installer built against

        env["LLAMA_SERVER_CMAKE_ARGS"] = vulkan_include_args(env, print).strip()
    script = ROOT / "benchmarks" / "build_llama_server.sh"
    out = subprocess.run([str(script), "static", backend], capture_output=True, text=True, check=True, env=env)
    return Path(out.stdout.strip())


def long_message(i: int, words: int) -> str:
    """A distinct long message (no prefix shared across rounds: neither peer's prompt cache helps)."""
    text = f"Round {i}. " + "".join(FILLER.format(i=f"{i}.{k}") for k in range(words // 35 + 1))
    return text + "\nSummarise the harbour master's notes in one sentence."


def stream_chat(client: httpx.Client, url: str, message: str, max_tokens: int) -> tuple[Sample, int]:
    """One streamed /v1/chat/completions call to llama-server: the sample and the prompt's token count."""
    body = {
        "messages": [{"role": "user", "content": message}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    tokens = prompt_tokens = 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
            delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
            if delta.get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                tokens += 1
    assert first is not None and last is not None
    return Sample(first - start, (tokens - 1) / max(last - first, 1e-9), tokens), prompt_tokens


def lmsp_chat(client: httpx.Client, url: str, model: str, message: str, max_tokens: int) -> tuple[Sample, int]:
    turn = stream_lmsp_turn(client, url, message, max_tokens, model=model)
    return turn.sample, turn.usage.get("input_tokens", 0)


def streams(run, n: int, tokens: int) -> float:
    """n streams at once: aggregate decode tokens per second over the wall time."""
    start = time.perf_counter()

    def one(i: int) -> Sample:
        with httpx.Client(timeout=1200) as c:
            return run(c, f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}.", tokens)[0]

    with cf.ThreadPoolExecutor(n) as pool:
        samples = list(pool.map(one, range(n)))
    return sum(s.tokens for s in samples) / (time.perf_counter() - start)


def measure(run, rounds: int, tokens: int, prompt_words: int) -> dict[str, float]:
    """Medians over `rounds`: decode tok/s at 1 and 4 streams, TTFT, prompt evaluation tok/s."""
    one, four, ttft, prompt = [], [], [], []
    with httpx.Client(timeout=1200) as c:
        run(c, "Say hello.", 8)  # warm-up: the first request compiles the device's pipelines
        for i in range(rounds):
            sample, _ = run(c, f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}.", tokens)
            one.append(sample.decode_tps)
            ttft.append(sample.ttft)
            sample, n_prompt = run(c, long_message(i, prompt_words), 1)
            prompt.append(n_prompt / sample.ttft)
            four.append(streams(run, 4, tokens))
    return {
        "decode 1 stream (tok/s)": statistics.median(one),
        "decode 4 streams (tok/s)": statistics.median(four),
        "TTFT (ms)": statistics.median(ttft) * 1000,
        "prompt eval (tok/s)": statistics.median(prompt),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the Gemma 3 270M demo model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded per stream")
    parser.add_argument("--prompt-tokens", type=int, default=5000, help="about this many tokens of prompt")
    args = parser.parse_args()
    model = args.model or gemma_path()
    backend = build_backend()
    threads = physical_cores()
    server = llama_server_for(backend)
    prompt_words = int(args.prompt_tokens * 0.7)  # about 1.4 tokens per English word in these notes
    print(f"model {model.name}; llama.cpp backend {backend}; llama-server {server}")

    results: dict[str, dict[str, float]] = {}
    with lmsp_service(model, threads=threads, config="parallel = 4\n") as (url, _):
        with httpx.Client(timeout=60) as c:
            document = c.get(url).json()
            ids = [m["id"] for m in c.get(f"{url}/models", headers=url.headers).json()["data"]]
        lmsp_tray = document.get("extensions", {}).get("lmsp_tray", {})
        print("lmsp-tray backend:", lmsp_tray.get("backend"), "devices:", lmsp_tray.get("devices"))
        results["lmsp-tray"] = measure(
            lambda c, m, n: lmsp_chat(c, url, ids[0], m, n), args.rounds, args.tokens, prompt_words
        )
    with llama_server(server, model, parallel=4, threads=threads, extra=("-ngl", "99")) as url:
        with httpx.Client(timeout=60) as c:
            props = c.get(f"{url}/props").json()
        print("llama-server:", props.get("build_info", ""), props.get("model_path", ""))
        results["llama-server"] = measure(
            lambda c, m, n: stream_chat(c, url, m, n), args.rounds, args.tokens, prompt_words
        )

    names = list(results["lmsp-tray"])
    rows = [(peer, *(f"{results[peer][k]:.1f}" for k in names)) for peer in results]
    print_table(rows, ("peer", *names))
    print("\nlmsp-tray / llama-server (targets >= 0.95; TTFT inverted, lower is better):")
    for k in names:
        ours, theirs = results["lmsp-tray"][k], results["llama-server"][k]
        ratio = theirs / ours if k.startswith("TTFT") else ours / theirs
        print(f"  {k:28s} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
