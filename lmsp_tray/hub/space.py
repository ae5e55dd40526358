"""Refusing a download the disk cannot hold, before the first byte.

`free_bytes` is the seam: `Puller` takes any ``(folder) -> free bytes``
function, so tests can give a machine a small disk without a tmpfs (mounting
one needs root); the default asks the OS for the folder's file system. A
download needs what is left to fetch of every file (a resumed partial counts
as fetched) plus `HEADROOM_BYTES`, so a pull never fills a disk to the last
byte. A disk that fills up anyway (another program writing) ends the pull
with the same error, the partial file kept for a resume.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from lmsp_tray.errors import InsufficientStorage

FreeSpace = Callable[[Path], int]
HEADROOM_BYTES = 64 * 1024 * 1024


def disk_free(folder: Path) -> int:
    """Free bytes on the file system that holds `folder` (or its nearest existing parent)."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10_000_000 else f"{n / 1e6:.1f} MB"


def check_space(folder: Path, to_fetch: int, free_space: FreeSpace = disk_free) -> None:
    """`InsufficientStorage` when `folder`'s disk lacks `to_fetch` bytes plus the headroom."""
    if to_fetch <= 0:
        return
    required = to_fetch + HEADROOM_BYTES
    available = free_space(folder)
    if available >= required:
        return
    raise InsufficientStorage(
        f"Not enough disk space: this download needs {gb(required)} free ({gb(to_fetch)} to fetch and "
        f"{gb(HEADROOM_BYTES)} to spare) in {folder}, which has {gb(available)} free. Free "
        f"{gb(required - available)} or more, or point HF_HUB_CACHE at a bigger disk, and pull again.",
        extra={"required_bytes": required, "available_bytes": available, "path": str(folder)},
    )


def disk_full(folder: Path, done: int, total: int) -> InsufficientStorage:
    """The error for a disk that filled up during the download."""
    return InsufficientStorage(
        f"The disk holding {folder} filled up after {gb(done)} of {gb(total)}; the part already fetched is "
        "kept. Free some space and pull again to resume.",
        extra={"required_bytes": max(0, total - done) + HEADROOM_BYTES, "available_bytes": 0, "path": str(folder)},
    )
