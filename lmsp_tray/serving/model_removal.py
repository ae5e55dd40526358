"""Deleting a model: only files the service owns, never another app's, unloaded first.

Why here: deleting is a policy over discovery (where the file was found), the engine (a loaded
model is unloaded first; one generating is refused with 409 unless forced) and the hub (a
download in the Hugging Face cache is removed the way huggingface_hub removes a revision, and only
when the service's ledger says it downloaded it: `hub.remove`). Files in the service's own models
folder are deleted; files in LM Studio's, Ollama's, llama.cpp's or the person's own folders are
read in place and never deleted: the refusal says whose they are and where.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.sources import HUGGINGFACE, OWN
from lmsp_tray.engine.manager import ModelManager
from lmsp_tray.errors import Conflict
from lmsp_tray.hub.owned import Ledger
from lmsp_tray.hub.remove import NotOwned, delete_revision, owned_revision

OWNERS = {
    "custom": "your own models folder",
    "lm-studio": "LM Studio",
    "ollama": "Ollama",
    HUGGINGFACE: "the Hugging Face cache",
    "llama.cpp": "llama.cpp's cache",
}


@dataclass(frozen=True)
class Removed:
    model_id: str
    files: tuple[str, ...]
    freed_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "deleted": True,
            "files": list(self.files),
            "freed_bytes": self.freed_bytes,
        }


class ModelRemover:
    """Deletes models the service owns; `rescan` updates the catalog afterwards."""

    def __init__(
        self,
        models: ModelManager,
        *,
        models_dir: Path,
        hf_cache: Path,
        ledger: Ledger,
        rescan: Callable[[], object] = lambda: None,
    ) -> None:
        self.models = models
        self.models_dir = Path(models_dir)
        self.hf_cache = Path(hf_cache)
        self.ledger = ledger
        self.rescan = rescan

    def refusal(self, entry: ModelEntry) -> str | None:
        """Why `entry` cannot be deleted here (whose file it is and where), or None when it can."""
        if entry.source == OWN and _inside(entry.path, self.models_dir):
            return None
        if entry.source == HUGGINGFACE and _inside(entry.path, self.hf_cache):
            try:
                owned_revision(self.hf_cache, entry.path, self.ledger)
            except NotOwned as exc:
                return f"lmsp-tray only deletes what it downloaded: {exc}. Delete it with `hf cache delete`."
            return None
        owner = OWNERS.get(entry.source, entry.source)
        return (
            f"{entry.path} belongs to {owner}; lmsp-tray reads it in place and never deletes it. "
            f"Remove it with {owner if entry.source in ('lm-studio', 'ollama') else 'your file manager'}."
        )

    def remove(self, entry: ModelEntry, *, force: bool = False) -> Removed:
        """Unload (409 while generating, unless `force`), then delete. Blocking: run it on a thread."""
        refusal = self.refusal(entry)
        if refusal is not None:
            raise Conflict(refusal, extra={"owner": entry.source, "path": str(entry.path)})
        loaded = self.models.get(entry.id)
        if loaded is not None and loaded.busy and not force:
            raise Conflict(
                f"'{entry.id}' is generating; try again when it finishes, or delete it with force=true "
                "(its running requests end).",
            )
        self.models.unload(entry.id, drain=not force)
        if entry.source == HUGGINGFACE:
            revision, owned = owned_revision(self.hf_cache, entry.path, self.ledger)
            freed = delete_revision(self.hf_cache, revision, self.ledger)
            files = tuple(str(revision.snapshot / f) for f in owned.files)
        else:
            freed = entry.size_bytes
            files = (str(entry.path),)
            os.remove(entry.path)
        self.rescan()
        return Removed(entry.id, files, freed)


def _inside(path: Path, folder: Path) -> bool:
    try:
        Path(path).absolute().relative_to(Path(folder).absolute())
    except ValueError:
        return False
    return True
