"""Which memory allocator a model process runs with: jemalloc or tcmalloc where installed (Linux).

llama.cpp's CPU backend keeps its per-graph scratch (the work buffer where flash attention
tiles its queries, keys and values, one slice per thread) in memory from `new uint8_t[]`.
glibc's malloc serves an allocation that large from its own mmap, 16 bytes past a page
boundary, or from its heap at whatever 16-byte offset the heap has reached; the tiles'
64-byte vector loads then straddle cache lines. On a 2-core Zen 5 that made a 5,400-token
prompt evaluation take 7.2–7.6 s instead of 6.3–6.7 s (`benchmarks/cold_prefill.py`;
llama-server, the same code, is fast or slow depending only on where glibc put that buffer:
its static build with `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072` is as slow).
jemalloc and tcmalloc return page-aligned memory for allocations that large, so the model
process preloads one of them when the system has it (`allocator = "auto"`, the default);
`allocator = "system"` keeps the C library's. Only the model's own process is affected: the
service's process, and every other program, keep theirs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

CHOICES = ("auto", "system")
# Tried in this order; the first that exists is used.
LIBRARIES = (
    ("jemalloc", "libjemalloc.so.2"),
    ("tcmalloc", "libtcmalloc_minimal.so.4"),
    ("tcmalloc", "libtcmalloc.so.4"),
)
# tcmalloc reports every allocation over 1 GiB on stderr (a model's weights or KV cache often
# are); that is not news for a model process.
_TCMALLOC_QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 62)}


@dataclass(frozen=True)
class Allocator:
    name: str  # "jemalloc" | "tcmalloc"
    path: Path

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """Variables to add to `base` so that a process started with them runs on this allocator
        (a preload the user set already comes after ours)."""
        preload = " ".join(p for p in (str(self.path), base.get("LD_PRELOAD", "")) if p)
        extra = {"LD_PRELOAD": preload}
        if self.name == "tcmalloc":
            extra.update({k: v for k, v in _TCMALLOC_QUIET.items() if k not in base})
        return extra


def library_dirs() -> list[Path]:
    """Where distributions install shared libraries for this machine's architecture."""
    arch = getattr(sys.implementation, "_multiarch", None)
    dirs = [f"/usr/lib/{arch}", f"/lib/{arch}"] if arch else []
    dirs += ["/usr/lib64", "/usr/lib", "/usr/local/lib"]
    return [Path(d) for d in dirs]


def find(choice: str = "auto", dirs: Iterable[Path] | None = None, platform: str = sys.platform) -> Allocator | None:
    """The allocator a model process should preload, or None for the C library's own."""
    if choice == "system" or not platform.startswith("linux"):
        return None
    folders = list(library_dirs() if dirs is None else dirs)
    for name, filename in LIBRARIES:
        for folder in folders:
            path = folder / filename
            if path.is_file() and os.access(path, os.R_OK):
                return Allocator(name, path)
    return None
