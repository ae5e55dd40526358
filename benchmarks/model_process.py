"""What running a model in its own process costs, and where tokenization should live.

    .venv/bin/python benchmarks/model_process.py [--rounds 50]

On the Gemma 3 270M file (262k-token vocabulary), measured here:
  load          the model loaded in this process vs in a model process (start, load, READY)
  tokenize      a prompt tokenized in-process vs by the model process (a round trip over the
                pipe), for a short chat turn and a 20 kB conversation; medians
  vocab-only    what keeping the tokenizer in the service instead would cost: loading the
                vocabulary alone (`vocab_only`) in a fresh process, time and resident memory
Prints a table; the choice it informs is in engine/process.py's docstring.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from common import gemma_path, physical_cores, print_table

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.load_plan import LoadOptions, plan_load
from lmsp_tray.engine.process import ModelProcess
from lmsp_tray.runner.model import LlamaModel
from lmsp_tray.runner.runtime import Runtime

VOCAB_ONLY = """
import os, sys, time, llama_cpp
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
llama_cpp.llama_backend_init()
before = rss(); t = time.perf_counter()
p = llama_cpp.llama_model_default_params(); p.vocab_only = True
m = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), p)
assert m
print(time.perf_counter() - t, rss() - before)
"""


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    path = gemma_path()
    entry = ModelEntry("gemma", path, "custom", path.stat().st_size, (path,), read_gguf_info(path))
    options = LoadOptions(threads=physical_cores(), parallel=1)
    plan = plan_load(entry, options, gpu_free_bytes=None, cores=physical_cores())
    short = "<start_of_turn>user\nWrite a story about a lighthouse keeper.<end_of_turn>\n<start_of_turn>model\n"
    turn = "<start_of_turn>user\nTell me more about the sea and the storm.<end_of_turn>\n<start_of_turn>model\n"
    long = turn * (20_000 // len(turn))
    rows = []

    t = time.perf_counter()
    local = LlamaModel(Runtime(), entry, options, plan)
    rows.append(("load, in this process", f"{(time.perf_counter() - t) * 1000:.0f} ms"))
    t = time.perf_counter()
    remote = ModelProcess(entry, options, plan)
    rows.append(("load, model process (start + load + READY)", f"{(time.perf_counter() - t) * 1000:.0f} ms"))
    try:
        local.tokenize_prompt(long)
        remote.tokenize_prompt(long)
        time.sleep(1.0)  # the piece tokenizers are built in the background on the first long prompt
        for name, text in (("short turn", short), (f"{len(long) // 1000} kB conversation", long)):
            here = median_ms(lambda text=text: local.tokenize_prompt(text), args.rounds)
            there = median_ms(lambda text=text: remote.tokenize_prompt(text), args.rounds)
            rows.append((f"tokenize {name}, in this process", f"{here:.2f} ms"))
            rows.append((f"tokenize {name}, model process", f"{there:.2f} ms (+{there - here:.2f})"))
    finally:
        remote.close()
        local.close()
    out = subprocess.run([sys.executable, "-c", VOCAB_ONLY, str(path)], capture_output=True, text=True, check=True)
    seconds, rss = out.stdout.split()
    rows.append(("vocab-only load in the service (time)", f"{float(seconds) * 1000:.0f} ms"))
    rows.append(("vocab-only load in the service (memory)", f"{int(rss) / 2**20:.0f} MiB"))
    print_table(rows, ("what", "cost"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
