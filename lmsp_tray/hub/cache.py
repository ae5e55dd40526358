"""The Hugging Face cache layout, so a pulled file is one every other tool finds and reuses.

The layout ``huggingface_hub`` defines (and llama.cpp, LM Studio's importer,
``hf cache scan`` and lmsp-tray's own discovery read)::

    <cache>/models--<org>--<repo>/blobs/<etag>            the content (etag: SHA-256 of an LFS file)
    <cache>/models--<org>--<repo>/snapshots/<commit>/<path> -> ../../blobs/<etag>
    <cache>/models--<org>--<repo>/refs/<branch>            the commit the branch pointed at
    <cache>/.locks/models--<org>--<repo>/<etag>.lock       held while a blob is being written

A download in progress is ``blobs/<etag>.incomplete`` — the name older
``huggingface_hub`` releases resume from too — and is never under
``snapshots/``, which is all discovery looks at: a partial file is never
listed as a model. The snapshot link is made only once the blob is complete
and verified, atomically (a hidden temporary link renamed into place).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

COMMIT = re.compile(r"[0-9a-f]{40}")


def repo_folder_name(*, repo_id: str, repo_type: str = "model") -> str:
    """``models--org--name``: huggingface_hub's folder name for a repository (its `repo_folder_name`)."""
    return "--".join([f"{repo_type}s", *repo_id.split("/")])


@dataclass(frozen=True)
class RepoCache:
    """The cache folders of one model repository."""

    root: Path  # the hub cache (HF_HUB_CACHE)
    repo_id: str

    @property
    def folder(self) -> Path:
        return self.root / repo_folder_name(repo_id=self.repo_id, repo_type="model")

    def blob(self, etag: str) -> Path:
        return self.folder / "blobs" / etag

    def partial(self, etag: str) -> Path:
        return self.folder / "blobs" / f"{etag}.incomplete"

    def pointer(self, commit: str, path: str) -> Path:
        return self.folder / "snapshots" / commit / Path(*path.split("/"))

    def lock(self, etag: str) -> Path:
        return self.root / ".locks" / repo_folder_name(repo_id=self.repo_id, repo_type="model") / f"{etag}.lock"

    def write_ref(self, revision: str, commit: str) -> None:
        """Remember which commit a branch or tag named (what ``huggingface_hub`` does); commits need no ref."""
        if revision == commit or COMMIT.fullmatch(revision):
            return
        ref = self.folder / "refs" / Path(*revision.split("/"))
        ref.parent.mkdir(parents=True, exist_ok=True)
        try:
            if ref.read_text(encoding="utf-8").strip() == commit:
                return
        except OSError:
            pass
        tmp = ref.with_name(f".{ref.name}.{uuid.uuid4().hex[:12]}.tmp")
        tmp.write_text(commit, encoding="utf-8")
        os.replace(tmp, ref)

    def link(self, etag: str, commit: str, path: str) -> Path:
        """Put ``snapshots/<commit>/<path>`` in place, pointing at the blob; returns the pointer."""
        blob, pointer = self.blob(etag), self.pointer(commit, path)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        tmp = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:12]}.tmp")  # hidden: discovery skips it
        try:
            os.symlink(os.path.relpath(blob, pointer.parent), tmp)
        except (OSError, NotImplementedError):  # no symlinks (Windows without developer mode)
            try:
                os.link(blob, tmp)
            except OSError:
                shutil.copyfile(blob, tmp)
        os.replace(tmp, pointer)
        return pointer


def present(pointer: Path, size: int) -> bool:
    """Whether a snapshot file is there, complete (its target has the expected size)."""
    try:
        return pointer.stat().st_size == size
    except OSError:
        return False
