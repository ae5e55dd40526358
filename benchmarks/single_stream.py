"""Single-stream latency and decode speed: this service vs llama-cpp-python in-process and its server.

    .venv/bin/python benchmarks/single_stream.py [--tokens 128] [--runs 7]

(a) llama-cpp-python in-process (`Llama.create_completion(stream=True)`),
(b) lmsp-tray over HTTP SSE (`POST /lmsp/v1/responses`, stream),
(c) `python -m llama_cpp.server` streaming `/v1/completions`, as users run it
    (its defaults: half the CPUs, 2048 context), and (c=) with our thread count;
same Gemma 3 270M file, same rendered prompt, temperature 0, interleaved runs;
a and b use the same threads (physical cores, the service's default). Prints
medians and the ratios (targets: decode b/a ≥ 0.97, TTFT overhead b−a ≤ 15 ms,
decode b/c ≥ 1.5; b/c= is printed for engine parity), plus the idle RSS of the
service with no model loaded.
"""

from __future__ import annotations

import argparse
import sys

import httpx
from common import (
    GEMMA_MESSAGE,
    GEMMA_PROMPT,
    Series,
    gemma_path,
    in_process_sample,
    llama_cpp_server,
    lmsp_service,
    physical_cores,
    print_table,
    rss_bytes,
    stream_lmsp,
    stream_openai_completion,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()

    import llama_cpp

    model = gemma_path()
    print(f"model {model.name}, {args.tokens} output tokens, {args.threads} threads, {args.runs} interleaved runs")
    llm = llama_cpp.Llama(str(model), n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    # llama-cpp-python's Llama turns flash attention off unless asked; llama.cpp's own default (auto),
    # which lmsp-tray and llama-server keep, turns it on where the backend has it. a= is engine parity.
    llm_fa = llama_cpp.Llama(
        str(model), n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads, flash_attn=True, verbose=False
    )
    a, b = Series("a: llama-cpp-python in-process"), Series("b: lmsp-tray HTTP SSE")
    ae = Series("a=: in-process, flash attention on")
    c, ce = Series("c: llama_cpp.server SSE, its defaults"), Series("c=: llama_cpp.server SSE, same threads")
    with (
        lmsp_service(model, threads=args.threads) as (url, proc),
        llama_cpp_server(model, threads=None) as srv,
        llama_cpp_server(model, threads=args.threads) as srv_eq,
    ):
        idle_rss = rss_bytes(proc.pid)
        with httpx.Client(timeout=300) as client:
            # Warm-up: load the model in each peer, fill caches.
            stream_lmsp(client, url, GEMMA_MESSAGE, 8)
            stream_openai_completion(client, srv, GEMMA_PROMPT, 8)
            stream_openai_completion(client, srv_eq, GEMMA_PROMPT, 8)
            in_process_sample(llm, GEMMA_PROMPT, 8)
            in_process_sample(llm_fa, GEMMA_PROMPT, 8)
            peers = [
                (a, lambda: in_process_sample(llm, GEMMA_PROMPT, args.tokens)),
                (ae, lambda: in_process_sample(llm_fa, GEMMA_PROMPT, args.tokens)),
                (b, lambda: stream_lmsp(client, url, GEMMA_MESSAGE, args.tokens)[0]),
                (c, lambda: stream_openai_completion(client, srv, GEMMA_PROMPT, args.tokens)),
                (ce, lambda: stream_openai_completion(client, srv_eq, GEMMA_PROMPT, args.tokens)),
            ]
            for run in range(args.runs):
                turn = run % len(peers)
                for series, sample in peers[turn:] + peers[:turn]:
                    series.samples.append(sample())
    rows = []
    for s in (a, ae, b, c, ce):
        rows.append(
            (s.name, f"{s.median('decode_tps'):.1f}", f"{s.median('ttft') * 1000:.1f}", f"{s.median('tokens'):.0f}")
        )
    print_table(rows, ("peer", "decode tok/s", "TTFT ms", "tokens"))
    ba = b.median("decode_tps") / a.median("decode_tps")
    bc = b.median("decode_tps") / c.median("decode_tps")
    bce = b.median("decode_tps") / ce.median("decode_tps")
    bae = b.median("decode_tps") / ae.median("decode_tps")
    overhead = (b.median("ttft") - a.median("ttft")) * 1000
    print(f"\ndecode b/a = {ba:.3f} (target >= 0.97)")
    print(f"decode b/a= = {bae:.3f} (in-process given flash attention too: engine parity)")
    print(f"TTFT overhead b - a = {overhead:.1f} ms (target <= 15 ms)")
    print(f"decode b/c = {bc:.3f} (target >= 1.5; llama_cpp.server as users run it)")
    print(f"decode b/c= = {bce:.3f} (llama_cpp.server given the same threads: engine parity)")
    print(f"idle service RSS, no model loaded: {idle_rss / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
