"""Deleting a revision this service downloaded from the Hugging Face cache, as huggingface_hub does.

Why through huggingface_hub: `scan_cache_dir().delete_revisions(commit).execute()` removes the
snapshot, the blobs no other revision uses, the refs that pointed at it and an emptied repository
folder, so the cache stays consistent for every tool that reads it (`hf cache scan` included).
Only a revision in the service's ledger (`hub.owned`) is removed, and only when every file in it is
one the service fetched: a file someone else put in the same snapshot would go with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmsp_tray.hub.cache import COMMIT
from lmsp_tray.hub.owned import Ledger, OwnedRevision


class NotOwned(Exception):
    """The file is not one this service downloaded (the message says whose it is, and where)."""


@dataclass(frozen=True)
class CachedRevision:
    repo_id: str
    commit: str
    snapshot: Path


def cached_revision(cache_root: Path, path: Path) -> CachedRevision | None:
    """The repository and commit of a snapshot file (``models--org--repo/snapshots/<commit>/…``)."""
    try:
        relative = Path(path).relative_to(cache_root)
    except ValueError:
        return None
    parts = relative.parts
    if (
        len(parts) < 4
        or not parts[0].startswith("models--")
        or parts[1] != "snapshots"
        or not COMMIT.fullmatch(parts[2])
    ):
        return None
    repo_id = "/".join(parts[0].removeprefix("models--").split("--"))
    return CachedRevision(repo_id, parts[2], cache_root / parts[0] / "snapshots" / parts[2])


def snapshot_files(snapshot: Path) -> list[str]:
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir())


def owned_revision(cache_root: Path, path: Path, ledger: Ledger) -> tuple[CachedRevision, OwnedRevision]:
    """The revision holding `path` when this service downloaded all of it; else `NotOwned` saying why."""
    cached = cached_revision(cache_root, path)
    if cached is None:
        raise NotOwned(f"{path} is not in the Hugging Face cache at {cache_root}")
    owned = ledger.owns(cached.repo_id, cached.commit)
    if owned is None:
        raise NotOwned(
            f"{cached.repo_id} (revision {cached.commit[:12]}) in the Hugging Face cache at {cache_root} was not "
            "downloaded by lmsp-tray (another tool, or you, put it there)"
        )
    others = [f for f in snapshot_files(cached.snapshot) if f not in owned.files]
    if others:
        raise NotOwned(
            f"revision {cached.commit[:12]} of {cached.repo_id} in {cache_root} also holds files lmsp-tray did not "
            f"download ({', '.join(others[:5])}); deleting the revision would remove them too"
        )
    return cached, owned


def delete_revision(cache_root: Path, revision: CachedRevision, ledger: Ledger) -> int:
    """Remove the revision the way huggingface_hub does; the bytes freed. Blocking (file work)."""
    from huggingface_hub import scan_cache_dir

    strategy = scan_cache_dir(cache_root).delete_revisions(revision.commit)
    strategy.execute()
    ledger.forget(revision.repo_id, revision.commit)
    return int(strategy.expected_freed_size)
