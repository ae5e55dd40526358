"""A pull, start to end: what to fetch (`Puller.plan`), fetching it (`Puller.run`), and what came of it.

`plan` reads the repository at one commit, picks the variant (`variants`),
adds the ``mmproj`` projector of a vision model, notes what the cache already
holds (a whole file, or a part to resume), reads the model's header from the
Hub to say whether it fits this machine (`fit`), and fails early on a gated
repository. `check_space` refuses it when the disk is too small. `run` fetches
each missing file through the shared `Transfers` (so two pulls of one file
download it once), reporting `PullProgress` — bytes, speed over the last
seconds, time left — then links every file into the snapshot at once, inside
`publish_guard` (the daemon passes the catalog's scan lock: a scan sees the
model whole or not at all), and says again whether it fits, now from the
file. A `PullPlan` is plain JSON both ways, so a service restart resumes the
same commit.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmsp_tray.discovery.gguf_header import GGUFError, read_gguf_info
from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.hub.cache import RepoCache, present
from lmsp_tray.hub.errors import DownloadCancelled
from lmsp_tray.hub.fit import Fit, Machine, assess
from lmsp_tray.hub.owned import Ledger
from lmsp_tray.hub.refs import parse_ref
from lmsp_tray.hub.remote import HubClient, RepoListing
from lmsp_tray.hub.remote_header import remote_info
from lmsp_tray.hub.space import FreeSpace, check_space, disk_free
from lmsp_tray.hub.transfer import CancelToken, FileProgress, FileSpec, Transfers, fetch_blob
from lmsp_tray.hub.variants import Choice, Variant, choose, projector_for, variants

log = logging.getLogger("lmsp_tray.hub")

SPEED_WINDOW_S = 10.0
MODEL, PROJECTOR = "model", "projector"


@dataclass(frozen=True)
class PlannedFile:
    spec: FileSpec
    role: str  # MODEL (a part of the model) | PROJECTOR (the mmproj file)
    present: bool = False  # already whole in the cache at this commit
    partial: int = 0  # bytes of it already fetched (a resume)

    def to_json(self) -> dict[str, Any]:
        s = self.spec
        return {"path": s.path, "size": s.size, "sha256": s.sha256, "blob_id": s.blob_id, "role": self.role}


@dataclass(frozen=True)
class PullPlan:
    ref: str  # the model as named, normalised (hf.co/org/repo:Q4_K_M, org/repo/file.gguf)
    repo_id: str
    revision: str
    commit: str
    quant: str | None
    reason: str  # why this variant
    files: tuple[PlannedFile, ...]
    fit: Fit | None = None  # before downloading, from the header read on the Hub
    gated: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.spec.size for f in self.files)

    @property
    def to_fetch(self) -> int:
        return sum(f.spec.size - f.partial for f in self.files if not f.present)

    @property
    def model_files(self) -> tuple[PlannedFile, ...]:
        return tuple(f for f in self.files if f.role == MODEL)

    @property
    def projector(self) -> PlannedFile | None:
        return next((f for f in self.files if f.role == PROJECTOR), None)

    @property
    def complete(self) -> bool:
        return all(f.present for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "repository": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "quantization": self.quant,
            "reason": self.reason,
            "files": [f.to_json() for f in self.files],
            "total_bytes": self.total_bytes,
            "fit": self.fit.to_json() if self.fit else None,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PullPlan:
        """The plan a task stored (what is present is looked at again when it runs)."""
        files = tuple(
            PlannedFile(
                FileSpec(
                    doc["repository"], doc["commit"], f["path"], int(f["size"]), f.get("sha256"), f.get("blob_id")
                ),
                f.get("role", MODEL),
            )
            for f in doc["files"]
        )
        return cls(
            doc["ref"],
            doc["repository"],
            doc["revision"],
            doc["commit"],
            doc.get("quantization"),
            doc.get("reason", ""),
            files,
        )


@dataclass(frozen=True)
class PullProgress:
    bytes_done: int
    bytes_total: int
    bytes_per_second: float | None
    eta_seconds: int | None
    file: str
    file_bytes_done: int
    file_bytes_total: int
    files_done: int
    files_total: int
    phase: str  # "checking" | "downloading" | "waiting" | "verifying"

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "bytes_per_second": None if self.bytes_per_second is None else round(self.bytes_per_second),
            "eta_seconds": self.eta_seconds,
            "file": self.file,
            "file_bytes_done": self.file_bytes_done,
            "file_bytes_total": self.file_bytes_total,
            "files_done": self.files_done,
            "files_total": self.files_total,
        }


@dataclass(frozen=True)
class PullResult:
    plan: PullPlan
    model_path: Path  # the snapshot file llama.cpp opens (part 1 of a split model)
    paths: tuple[Path, ...]
    projector_path: Path | None
    fetched_bytes: int  # over the network, this run
    seconds: float
    fit: Fit | None = None  # from the downloaded file's header
    already_present: bool = False


@dataclass(frozen=True)
class RepoVariants:
    """What `pull --list` shows: every variant, the default, and how each would fit."""

    listing: RepoListing
    variants: tuple[Variant, ...]
    default: Choice | None
    projector: str | None
    fits: dict[str, Fit] = field(default_factory=dict)  # by variant label


class _Meter:
    """Bytes per second over the last `SPEED_WINDOW_S` seconds of the network transfer."""

    def __init__(self) -> None:
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, fetched_total: int) -> float | None:
        now = time.monotonic()
        self._samples.append((now, fetched_total))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.popleft()
        t0, b0 = self._samples[0]
        if now - t0 < 0.5:
            return None
        return (fetched_total - b0) / (now - t0)


class _FileReporter:
    """Turns one file's progress into the pull's (bytes over all files, speed, time left)."""

    def __init__(
        self,
        progress: Callable[[PullProgress], None],
        meter: _Meter,
        total: int,
        base: int,
        fetched0: int,
        index: int,
        count: int,
    ) -> None:
        self._progress, self._meter, self._total = progress, meter, total
        self._base, self._fetched0, self._index, self._count = base, fetched0, index, count
        self.fetched = 0

    def __call__(self, p: FileProgress) -> None:
        self.fetched = p.fetched
        speed = self._meter.add(self._fetched0 + p.fetched) if p.phase == "downloading" else None
        left = self._total - self._base - p.done
        eta = 0 if left <= 0 else (int(left / speed) + 1 if speed else None)
        self._progress(
            PullProgress(
                self._base + p.done, self._total, speed, eta, p.path, p.done, p.total, self._index, self._count, p.phase
            )
        )


class Puller:
    """Plans and runs pulls into the Hugging Face cache at `cache_root`."""

    def __init__(
        self,
        cache_root: Path,
        *,
        client: HubClient | None = None,
        options: LoadOptions | None = None,
        machine: Callable[[], Machine] | None = None,
        free_space: FreeSpace = disk_free,
        transfers: Transfers | None = None,
        publish_guard: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        ledger: Ledger | None = None,
    ) -> None:
        self.cache_root = Path(cache_root)
        self.client = client or HubClient()
        self.options = options or LoadOptions()
        self.machine = machine or Machine.this_one
        self.free_space = free_space
        self.transfers = transfers or Transfers()
        self.publish_guard = publish_guard
        self.ledger = ledger  # where finished pulls are recorded (the revisions the service may delete)

    def _cache(self, repo_id: str) -> RepoCache:
        return RepoCache(self.cache_root, repo_id)

    # -- planning ---------------------------------------------------------------------------------
    def plan(self, text: str, *, projector: bool = True, fit: bool = True) -> PullPlan:
        """What pulling `text` means now (network: the listing, one HEAD, a header read)."""
        ref = parse_ref(text, endpoint=self.client.endpoint)
        listing = self.client.listing(ref.repo_id, ref.revision)
        choice = choose(variants(listing.files), ref.repo_id, quant=ref.quant, filename=ref.filename)
        cache = self._cache(ref.repo_id)
        roles = [(f, MODEL) for f in choice.variant.files]
        extra = projector_for(listing.files, choice.variant) if projector else None
        if extra is not None:
            roles.append((extra, PROJECTOR))
        files = tuple(self._planned(cache, listing, f, role) for f, role in roles)
        first = choice.variant.first
        location = self.client.locate(ref.repo_id, listing.commit, first.path)  # gated: refused here
        info = remote_info(self.client, location, first.size) if fit else None
        verdict = assess(info, choice.variant.size, self.options, self.machine()) if fit else None
        label = str(ref) if ref.filename else f"hf.co/{ref.repo_id}:{choice.variant.label}"
        return PullPlan(
            label,
            ref.repo_id,
            ref.revision,
            listing.commit,
            choice.variant.quant,
            choice.reason,
            files,
            verdict,
            listing.gated,
        )

    def _planned(self, cache: RepoCache, listing: RepoListing, f: Any, role: str) -> PlannedFile:
        spec = FileSpec(listing.repo_id, listing.commit, f.path, f.size, f.sha256, f.blob_id)
        return self.refresh(cache, PlannedFile(spec, role))

    def refresh(self, cache: RepoCache, planned: PlannedFile) -> PlannedFile:
        """The file with what the cache holds of it now."""
        spec = planned.spec
        if present(cache.pointer(spec.commit, spec.path), spec.size):
            return PlannedFile(spec, planned.role, present=True)
        partial = 0
        with contextlib.suppress(OSError, Exception):
            partial = min(cache.partial(spec.etag).stat().st_size, spec.size)
        return PlannedFile(spec, planned.role, partial=partial)

    def refreshed(self, plan: PullPlan) -> PullPlan:
        cache = self._cache(plan.repo_id)
        return PullPlan(
            plan.ref,
            plan.repo_id,
            plan.revision,
            plan.commit,
            plan.quant,
            plan.reason,
            tuple(self.refresh(cache, f) for f in plan.files),
            plan.fit,
            plan.gated,
        )

    def check_space(self, plan: PullPlan) -> None:
        """`InsufficientStorage` when the cache's disk cannot hold what is left to fetch."""
        check_space(self.cache_root, self.refreshed(plan).to_fetch, self.free_space)

    def list_variants(self, text: str) -> RepoVariants:
        """Every GGUF variant of the repository, with sizes, the default and how each would fit."""
        ref = parse_ref(text, endpoint=self.client.endpoint)
        listing = self.client.listing(ref.repo_id, ref.revision)
        found = tuple(variants(listing.files))
        default: Choice | None = None
        with contextlib.suppress(Exception):
            default = choose(found, ref.repo_id)
        fits: dict[str, Fit] = {}
        if default is not None:
            location = self.client.locate(ref.repo_id, listing.commit, default.variant.first.path)
            info = remote_info(self.client, location, default.variant.first.size)  # the same model in every variant
            machine = self.machine()
            fits = {v.label: assess(info, v.size, self.options, machine) for v in found}
        extra = projector_for(listing.files, default.variant) if default else None
        return RepoVariants(listing, found, default, extra.path if extra else None, fits)

    # -- running ----------------------------------------------------------------------------------
    def run(self, plan: PullPlan, progress: Callable[[PullProgress], None], cancel: CancelToken) -> PullResult:
        """Fetch what is missing, verify it, link it into the snapshot; blocking (run it on a thread)."""
        started = time.monotonic()
        cache = self._cache(plan.repo_id)
        plan = self.refreshed(plan)
        total = plan.total_bytes
        meter = _Meter()
        done_before = 0  # bytes of the files finished before the current one
        fetched_before = 0
        files_done = 0
        for planned in plan.files:
            spec = planned.spec
            if cancel.cancelled:
                raise DownloadCancelled(cancel.reason)
            if planned.present:
                done_before += spec.size
                files_done += 1
                continue
            remaining = sum(f.spec.size - f.partial for f in plan.files[files_done:] if not f.present)
            check_space(self.cache_root, remaining, self.free_space)
            reporter = _FileReporter(progress, meter, total, done_before, fetched_before, files_done, len(plan.files))
            work = functools.partial(fetch_blob, self.client, cache, spec)
            self.transfers.fetch(cache.blob(spec.etag), work, reporter, cancel)
            done_before += spec.size
            fetched_before += reporter.fetched
            files_done += 1
        with self.publish_guard():
            paths = tuple(cache.link(f.spec.etag, plan.commit, f.spec.path) for f in plan.files)
            cache.write_ref(plan.revision, plan.commit)
        if self.ledger is not None and not plan.complete:  # fetched here (not all there before)
            self.ledger.add(plan.repo_id, plan.commit, [f.spec.path for f in plan.files])
        model_index = next(i for i, f in enumerate(plan.files) if f.role == MODEL)
        projector_index = next((i for i, f in enumerate(plan.files) if f.role == PROJECTOR), None)
        model_path = paths[model_index]
        fit = None
        try:
            model_size = sum(f.spec.size for f in plan.model_files)
            fit = assess(read_gguf_info(model_path), model_size, self.options, self.machine())
        except GGUFError as exc:
            log.warning("the downloaded %s has no readable header: %s", plan.ref, exc)
        return PullResult(
            plan=plan,
            model_path=model_path,
            paths=paths,
            projector_path=paths[projector_index] if projector_index is not None else None,
            fetched_bytes=fetched_before,
            seconds=time.monotonic() - started,
            fit=fit,
            already_present=plan.complete,
        )
