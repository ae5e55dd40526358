"""The revisions this service put into the Hugging Face cache: the only ones it may delete there.

Why a ledger: the cache is shared (huggingface_hub, llama.cpp, LM Studio's importer and the person's
own `hf download` fill it), and a file in it says nothing of who fetched it. Each pull that finishes
adds its repository, commit and files here (`downloads.json` in the service's data folder, written
whole in one rename by `private.write_private`); deleting a model from the cache removes its entry.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp_tray.private import write_private


@dataclass(frozen=True)
class OwnedRevision:
    repo_id: str
    commit: str
    files: tuple[str, ...]  # paths inside the snapshot


class Ledger:
    """`downloads.json`: read and changed under one lock (one service writes it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def revisions(self) -> list[OwnedRevision]:
        with self._lock:
            return self._read()

    def owns(self, repo_id: str, commit: str) -> OwnedRevision | None:
        return next((r for r in self.revisions() if (r.repo_id, r.commit) == (repo_id, commit)), None)

    def add(self, repo_id: str, commit: str, files: list[str]) -> None:
        """Record a finished pull (its files joined to those of the same revision pulled before)."""
        with self._lock:
            kept = self._read()
            before = next((r for r in kept if (r.repo_id, r.commit) == (repo_id, commit)), None)
            merged = sorted({*(before.files if before else ()), *files})
            kept = [r for r in kept if r is not before] + [OwnedRevision(repo_id, commit, tuple(merged))]
            self._write(kept)

    def forget(self, repo_id: str, commit: str) -> None:
        with self._lock:
            self._write([r for r in self._read() if (r.repo_id, r.commit) != (repo_id, commit)])

    def _read(self) -> list[OwnedRevision]:
        try:
            doc: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        rows = doc.get("revisions") if isinstance(doc, dict) else None
        out: list[OwnedRevision] = []
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and isinstance(row.get("repo_id"), str) and isinstance(row.get("commit"), str):
                files = tuple(str(f) for f in row.get("files") or [] if isinstance(f, str))
                out.append(OwnedRevision(row["repo_id"], row["commit"], files))
        return out

    def _write(self, revisions: list[OwnedRevision]) -> None:
        rows = [{"repo_id": r.repo_id, "commit": r.commit, "files": list(r.files)} for r in revisions]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_private(self.path, json.dumps({"revisions": rows}, indent=1) + "\n")
