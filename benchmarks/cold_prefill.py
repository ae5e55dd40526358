"""Cold prompt evaluation of a long conversation: lmsp-tray against llama-server, rounds interleaved.

    .venv/bin/python benchmarks/cold_prefill.py [--rounds 3] [--history-turns 48]

The whole 48-turn history (about 5,400 tokens, Gemma 3 270M, same threads) is
evaluated from nothing, and the time to the first token is taken:

  lmsp-tray, fresh      a new service, the model loaded first (untimed), prompt cache off
  lmsp-tray, reloaded   the same service after POST /models/{id}/unload and a new load (untimed):
                        a second model process on the same file
  llama-server -np 1    started fresh, the same prompt (its /completion endpoint), built two
                        ways from the same sources (build_llama_server.sh): static, the
                        reference of every other benchmark, and shared (llama.cpp's default
                        build, BUILD_SHARED_LIBS=ON, as its release archives ship and as
                        llama-cpp-python builds the libraries this service runs)

Each round runs all four back to back, so machine noise falls on each alike; the
medians and the ratios to each llama-server build are printed (the target: <= 1.05).
"""

from __future__ import annotations

import argparse
import statistics

import httpx
from common import GEMMA_ID, gemma_path, llama_server_binary, lmsp_service, physical_cores
from long_history import history, stream_llama_server
from throughput import history_prompt, llama_server, lmsp_history_turn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history-turns", type=int, default=48)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    model = gemma_path()
    binaries = {"static": llama_server_binary(), "shared": llama_server_binary("shared")}
    base = history(args.history_turns)
    question = "What should the keeper do next, in one line?"
    rows: dict[str, list[float]] = {"lmsp-tray, fresh": [], "lmsp-tray, reloaded": []}
    rows |= {f"llama-server -np 1, {link}": [] for link in binaries}
    config = "parallel = 1\nprompt_cache_gib = 0\nkeep_alive = '1h'\n"
    with httpx.Client(timeout=900) as c:
        for r in range(args.rounds):
            with lmsp_service(model, threads=args.threads, config=config) as (url, _):
                models = f"{url}/models/{GEMMA_ID}"
                c.post(f"{models}/load", headers=url.headers).raise_for_status()
                fresh, _, new = lmsp_history_turn(c, url, base, question, tokens=2)
                c.post(f"{models}/unload", headers=url.headers).raise_for_status()
                c.post(f"{models}/load", headers=url.headers).raise_for_status()
                again, _, new_again = lmsp_history_turn(c, url, base, question, tokens=2)
                assert new == new_again, (new, new_again)
            theirs = []
            for binary in binaries.values():
                with llama_server(binary, model, parallel=1, threads=args.threads) as ls:
                    theirs.append(stream_llama_server(c, ls, history_prompt(base, question), 2)[0])
            for name, value in zip(rows, (fresh, again, *theirs), strict=True):
                rows[name].append(value)
            print(
                f"round {r + 1}: {new} prompt tokens; lmsp-tray {fresh:.2f} s, reloaded {again:.2f} s, "
                f"llama-server static {theirs[0]:.2f} s, shared {theirs[1]:.2f} s",
                flush=True,
            )
    refs = {link: statistics.median(rows[f"llama-server -np 1, {link}"]) for link in binaries}
    print(f"{'':32s} median     / static / shared")
    for name, values in rows.items():
        med = statistics.median(values)
        ratios = "   ".join(f"{med / ref:.2f}" for ref in refs.values())
        print(f"{name:32s} {med:6.2f} s     {ratios}   ({', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
