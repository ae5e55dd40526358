"""How often is greedy output identical alone and batched, on the real Gemma 3 270M file?

    .venv/bin/python benchmarks/batch_identity.py [--prompts 20] [--tokens 64]

Two fresh service instances on the same file: in one, each prompt runs
alone; in the other, the prompts run four at a time (one decode batch).
Temperature 0 both times. Kernels may round differently for different batch
shapes, so greedy text can diverge after a near-tie; this prints how many
prompts came out identical and, for the others, where they first differ.
(On generated GGUFs the test suite requires identical output.)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import sys

import httpx
from common import gemma_path, lmsp_service, physical_cores, stream_lmsp

SUBJECTS = [
    "the moon",
    "bread",
    "a violin",
    "rain",
    "a bicycle",
    "the ocean",
    "a library",
    "winter",
    "coffee",
    "a volcano",
    "bees",
    "a lighthouse",
    "chess",
    "a desert",
    "a robot",
    "tea",
    "a river",
    "glass",
    "a clock",
    "mountains",
    "a garden",
    "the wind",
    "paper",
    "a bridge",
]


def prompts(n: int) -> list[str]:
    return [f"Write three sentences about {SUBJECTS[i % len(SUBJECTS)]}." for i in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    model = gemma_path()
    texts = prompts(args.prompts)

    def run_alone() -> list[str]:
        with lmsp_service(model, threads=args.threads) as (url, _), httpx.Client(timeout=600, headers=url.headers) as c:
            return [stream_lmsp(c, url, t, args.tokens)[1] for t in texts]

    alone = run_alone()
    control = run_alone()  # the same again on a fresh instance: is "alone" itself repeatable?

    def one(text: str) -> str:
        with httpx.Client(timeout=600, headers=url.headers) as own:
            return stream_lmsp(own, url, text, args.tokens)[1]

    with lmsp_service(model, threads=args.threads) as (url, _):
        batched: list[str] = []
        with cf.ThreadPoolExecutor(4) as pool:
            for start in range(0, len(texts), 4):
                batched += list(pool.map(one, texts[start : start + 4]))

    repeat = sum(a == b for a, b in zip(alone, control))
    print(f"control: {repeat} of {len(texts)} prompts gave identical text alone twice")
    same = sum(a == b for a, b in zip(alone, batched))
    print(
        f"{same} of {len(texts)} prompts gave identical text alone and batched by 4 "
        f"({args.tokens} tokens, temperature 0)"
    )
    for i, (a, b) in enumerate(zip(alone, batched)):
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  prompt {i + 1}: first difference at character {at} of {len(a)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
