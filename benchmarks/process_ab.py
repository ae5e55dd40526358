"""Models in their own processes vs in the service's process: the same build before and after, side by side.

    .venv/bin/python benchmarks/process_ab.py [--before acf4558] [--rounds 6] [--tokens 96]

Runs three peers on the Gemma 3 270M file, interleaved (the order rotates each
round), at 1 and 4 concurrent streams: lmsp-tray as of `--before` (a commit
whose models ran in the service's process; its sources are taken with `git
archive` into a temporary folder and run with this environment), lmsp-tray
as checked out (each model in a model process), and `llama-server -np 4`
(built by build_llama_server.sh). Prints the aggregate tokens/s, time to
first token, CPU time per generated token of each peer's whole process tree,
and the paired per-round ratios after/before and after/llama-server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
from common import (
    BENCH_SCOPES,
    ROOT,
    ServiceURL,
    free_port,
    gemma_path,
    llama_server_binary,
    physical_cores,
    stream_lmsp,
    wait_http,
)
from throughput import concurrent, llama_server, message, render, stream_openai_completion


@contextlib.contextmanager
def service(source: Path, model: Path, threads: int) -> Iterator[tuple[ServiceURL, int]]:
    """`lmsp-tray serve` run from `source` (its own lmsp_tray package) on `model`."""
    with tempfile.TemporaryDirectory() as home:
        models = Path(home) / "models-in"
        models.mkdir()
        (models / model.name).symlink_to(model)
        (Path(home) / "config").mkdir()
        (Path(home) / "config" / "config.toml").write_text(f"threads = {threads}\ndemo_model = false\n")
        env = {**os.environ, "LMSP_TRAY_HOME": home}
        scopes = [arg for scope in BENCH_SCOPES for arg in ("--scope", scope)]
        lmsp = [sys.executable, "-m", "lmsp_tray"]
        made = subprocess.run(
            [*lmsp, "tokens", "create", "--name", "ab", *scopes], env=env, cwd=source, capture_output=True, text=True
        )
        if made.returncode != 0:
            raise RuntimeError(made.stderr)
        port = free_port()
        args = ["serve", "--port", str(port), "--models-dir", str(models), "--no-default-dirs"]
        proc = subprocess.Popen(
            [*lmsp, *args], env=env, cwd=source, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        url = ServiceURL(f"http://127.0.0.1:{port}/lmsp/v1", {"Authorization": f"Bearer {made.stdout.strip()}"})
        try:
            wait_http(url)
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.wait(30)


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants."""
    table: dict[int, tuple[int, int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(d.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += table.get(pid, (0, 0))[1]
        todo += [p for p, (parent, _) in table.items() if parent == pid]
    return total / os.sysconf("SC_CLK_TCK")


def llama_server_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1].encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"llama-server") and port in cmd:
                return int(d.name)
    raise RuntimeError("llama-server not found")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="acf4558", help="a commit whose models ran in the service's process")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    model = gemma_path()
    binary = llama_server_binary()
    with contextlib.ExitStack() as stack:
        old_src = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "lmsp_tray"], capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive.stdout, check=True)
        before, before_pid = stack.enter_context(service(old_src, model, args.threads))
        after, after_pid = stack.enter_context(service(ROOT, model, args.threads))
        ls4 = stack.enter_context(llama_server(binary, model, parallel=4, threads=args.threads))
        peers = {
            f"before ({args.before}, in-process)": (
                before_pid,
                lambda c, i, n: stream_lmsp(c, before, message(i), n)[0],
            ),
            "after (model processes)": (after_pid, lambda c, i, n: stream_lmsp(c, after, message(i), n)[0]),
            "llama-server -np 4": (
                llama_server_pid(ls4),
                lambda c, i, n: stream_openai_completion(c, ls4, render(message(i)), n),
            ),
        }
        with httpx.Client(timeout=600) as c:
            for _, run in peers.values():
                run(c, 0, 8)
        names = list(peers)
        results: dict[tuple[str, int], list[tuple[float, float, list[float]]]] = {}
        for r in range(args.rounds):
            for n in (1, 4):
                for name in names[r % 3 :] + names[: r % 3]:
                    pid, run = peers[name]
                    cpu = tree_cpu(pid)
                    rate, ttfts = concurrent(run, n, args.tokens)
                    per_token = (tree_cpu(pid) - cpu) / (n * args.tokens)
                    results.setdefault((name, n), []).append((rate, per_token, ttfts))
    print(f"{args.rounds} rounds, {args.tokens} tokens per stream, {args.threads} threads")
    for n in (1, 4):
        for name in names:
            runs = results[(name, n)]
            print(
                f"{n} stream(s)  {name:34s} {statistics.median(r for r, _, _ in runs):6.1f} tok/s  "
                f"TTFT p50 {statistics.median(t for _, _, ts in runs for t in ts) * 1000:4.0f} ms  "
                f"CPU {statistics.median(c for _, c, _ in runs) * 1000:5.2f} ms/token  "
                f"(rounds: {', '.join(f'{r:.0f}' for r, _, _ in runs)})"
            )
    for n in (1, 4):
        after_runs, before_runs, ls_runs = (results[(name, n)] for name in (names[1], names[0], names[2]))
        vs_before = statistics.median(a[0] / b[0] for a, b in zip(after_runs, before_runs))
        vs_ls = statistics.median(a[0] / b[0] for a, b in zip(after_runs, ls_runs))
        print(f"{n} stream(s): after / before {vs_before:.3f}, after / llama-server -np 4 {vs_ls:.3f} (paired medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
