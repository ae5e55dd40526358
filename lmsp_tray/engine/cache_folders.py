"""Where the prompt cache keeps each model's saved sequence states: one folder per model file.

Why on the service's side: the model process writes and reads the states (`runner.prompt_cache`),
but the service reports what a model's states take on disk (`ModelManager.prompt_cache_bytes`)
without loading llama.cpp, so the folder layout both sides agree on lives here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SUFFIX = ".kvstate"


def model_folder(root: Path, model_path: Path) -> Path:
    """Where one model file's saved states live (other models' folders are theirs alone)."""
    return root / hashlib.blake2b(str(model_path.resolve()).encode(), digest_size=8).hexdigest()


def folder_bytes(folder: Path) -> int:
    """What the saved states in `folder` (and below) take on disk."""
    total = 0
    if folder.is_dir():
        for path in folder.rglob(f"*{SUFFIX}"):
            try:
                total += path.stat().st_size
            except OSError:
                pass
    return total
