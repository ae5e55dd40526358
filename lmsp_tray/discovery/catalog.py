"""The catalog: every model discovery found, under a stable id, safe to share between threads.

The daemon builds one `Catalog` (usually with `Catalog.from_config`) and
hands it to the service, which reads `entries()`, `get()` and `resolve()`
from any thread. `scan()` rebuilds the whole picture from disk: it walks the
sources, drops files reachable twice (an HF snapshot link and its blob, a
custom folder inside LM Studio's), reads headers through the header cache,
leaves out files that are not runnable models (mmproj/CLIP projectors,
vocab-only files, LoRA adapters, imatrix data) and names the rest (rules in
`naming`). Readers never see a half-built catalog: a scan publishes a new
immutable snapshot in one assignment. A scan of unchanged folders only lists
folders and stats files, so it is cheap to repeat (a folder watcher may call
it on every change).

A file that cannot be used still becomes an entry, with `error` set (the API
shows it in ``state: "error"``): bad magic, an unsupported version, a missing
split part or Ollama blob, weights cut short (its header is complete, so it
already has the id it keeps once complete). A file whose header itself is not
all there yet (empty, or cut inside the header: a copy or download in
progress) is no model yet and gets no id, which would change once the header
is written: it is listed apart, in `incomplete_files()`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.entry import GGUFInfo, IncompleteFile, ModelEntry
from lmsp_tray.discovery.naming import base_id, quantization_from_name, unique_ids
from lmsp_tray.discovery.scan import Found, HeaderCache, find_models, projector_of, read_headers
from lmsp_tray.discovery.sources import Source, default_sources

log = logging.getLogger(__name__)


def header_cache_file(paths: Paths) -> Path:
    """Where the header cache lives: a file under the cache folder."""
    return paths.cache_dir / "discovery" / "gguf-headers.json"


def default_workers() -> int:
    """Threads for reading headers that are not cached yet.

    Parsing holds the GIL, so threads only help by overlapping disk waits
    (a cold disk, a network drive); on a small machine they cost more than
    they give (measured: 200 page-cached files, 2 cores: 78 ms with one
    thread, 114 ms with two). One thread up to 2 cores, then half the cores, at most 4.
    """
    cpus = os.cpu_count() or 1
    return 1 if cpus <= 2 else min(4, cpus // 2)


@dataclass(frozen=True)
class ScanReport:
    """What the last scan did (for logs, the tray's tooltip and the benchmark)."""

    seconds: float
    found: int  # model files or split sets found, duplicates included
    duplicates: int  # the same file reached through two paths or sources
    models: int  # entries offered (errors included)
    errors: int  # entries with an error
    skipped: dict[str, int] = field(default_factory=dict)  # not runnable, by kind ("mmproj", "vocab", ...)
    headers_read: int = 0
    cache_hits: int = 0


@dataclass(frozen=True)
class _Snapshot:
    entries: tuple[ModelEntry, ...]
    by_id: Mapping[str, ModelEntry]
    by_folded: Mapping[str, ModelEntry]  # lower-case ids, then lower-case aliases
    incomplete: tuple[IncompleteFile, ...] = ()


_EMPTY = _Snapshot((), {}, {})


class Catalog:
    """The models found in `sources`, rescanned on demand."""

    def __init__(
        self, sources: Sequence[Source], *, cache_file: Path | None = None, workers: int | None = None
    ) -> None:
        self._sources = tuple(sources)
        self._cache = HeaderCache(cache_file)
        self._workers = default_workers() if workers is None else max(1, workers)
        self._scan_lock = threading.Lock()
        self._snapshot: _Snapshot | None = None
        self._report: ScanReport | None = None

    @classmethod
    def from_config(
        cls,
        paths: Paths,
        config: Config,
        *,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        platform: str | None = None,
        include_system: bool = True,
        workers: int | None = None,
    ) -> Catalog:
        """The catalog for this user: `default_sources` plus the header cache under `paths.cache_dir`."""
        sources = default_sources(paths, config, environ, home, platform=platform, include_system=include_system)
        return cls(sources, cache_file=header_cache_file(paths), workers=workers)

    @property
    def sources(self) -> tuple[Source, ...]:
        return self._sources

    def replace_sources(self, sources: Sequence[Source]) -> None:
        """Scan these folders from the next scan on (the model folders were changed in the settings)."""
        with self._scan_lock:
            self._sources = tuple(sources)

    @property
    def last_report(self) -> ScanReport | None:
        return self._report

    # -- reading ---------------------------------------------------------------------------------
    def _current(self) -> _Snapshot:
        snapshot = self._snapshot
        if snapshot is None:
            with self._scan_lock:  # a first reader scans; readers arriving meanwhile wait for it
                if self._snapshot is None:
                    self._scan_locked()
            snapshot = self._snapshot or _EMPTY
        return snapshot

    def entries(self) -> list[ModelEntry]:
        """All models, sorted by id (the first call scans if `scan()` never ran)."""
        return list(self._current().entries)

    def incomplete_files(self) -> list[IncompleteFile]:
        """Files whose header is not all there yet (not models, no id), by path."""
        return list(self._current().incomplete)

    def get(self, model_id: str) -> ModelEntry | None:
        """The model with exactly this id, or None."""
        return self._current().by_id.get(model_id)

    def resolve(self, name: str) -> ModelEntry | None:
        """The model a client means by `name`: the exact id, else ignoring case, else an
        Ollama alias of it, else ``name:latest`` (Ollama's default tag); None if none."""
        snapshot = self._current()
        entry = snapshot.by_id.get(name)
        if entry is None:
            folded = name.strip().lower()
            entry = snapshot.by_folded.get(folded)
            if entry is None and ":" not in folded.rsplit("/", 1)[-1]:
                entry = snapshot.by_folded.get(folded + ":latest")
        return entry

    # -- scanning --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def holding_scans(self) -> Iterator[None]:
        """No scan runs while the caller changes files (a download linking every part of a split model)."""
        with self._scan_lock:
            yield

    def scan(self) -> list[ModelEntry]:
        """Rescan every source now and return the entries (sorted by id)."""
        with self._scan_lock:
            return self._scan_locked()

    def _scan_locked(self) -> list[ModelEntry]:
        started = time.perf_counter()
        previous = self._report
        found = find_models(self._sources)
        unique = _drop_duplicates(found)
        headers, hits = read_headers(unique, self._cache, self._workers)
        skipped: Counter[str] = Counter()
        kept: list[tuple[Found, GGUFInfo | None, str | None, bool]] = []
        incomplete: list[IncompleteFile] = []
        for f, header in zip(unique, headers):
            info = header.info if header else None
            if info is not None and info.kind != "model":
                skipped[info.kind] += 1
                continue
            error = f.error or (header.error if header else None) or _split_problem(f, info)
            partial = bool(header and header.incomplete)
            if partial and info is None and not f.names and error:
                incomplete.append(IncompleteFile(f.path, f.source.name, f.size, error))
                continue
            if info is not None and info.quantization is None:
                guess = quantization_from_name(f.stem)
                if guess:
                    info = replace(info, quantization=guess)
            kept.append((f, info, error, partial))
        entries = _name(kept, self._cache)
        self._cache.save({str(f.path) for f in unique if f.readable} | {f.projector[0] for f in unique if f.projector})
        self._snapshot = _snapshot(entries, tuple(sorted(incomplete, key=lambda i: str(i.path))))
        self._report = ScanReport(
            seconds=time.perf_counter() - started,
            found=len(found),
            duplicates=len(found) - len(unique),
            models=len(entries),
            errors=sum(1 for e in entries if e.error),
            skipped=dict(skipped),
            headers_read=sum(1 for h in headers if h is not None) - hits,
            cache_hits=hits,
        )
        changed = previous is None or (previous.models, previous.errors) != (self._report.models, self._report.errors)
        log.log(  # a periodic rescan that found the same is not news
            logging.INFO if changed or incomplete else logging.DEBUG,
            "discovery: %d models (%d with errors, %d incomplete files) in %.3f s",
            len(entries),
            self._report.errors,
            len(incomplete),
            self._report.seconds,
        )
        return list(entries)


def _drop_duplicates(found: list[Found]) -> list[Found]:
    """Keep the first (highest precedence) of the Founds that are the same file."""
    seen: set[tuple[int, int]] = set()
    out = []
    for f in found:
        if f.identity is not None:
            if f.identity in seen:
                continue
            seen.add(f.identity)
        out.append(f)
    return out


def _split_problem(f: Found, info: GGUFInfo | None) -> str | None:
    """Disagreement between a file's name and its header about splitting."""
    if info is None or f.names:
        return None
    if f.split_count == 1 and info.split_count > 1:
        return (
            f"the header says this file is one of {info.split_count} parts of a split model, but its "
            f"name lacks the '-00001-of-{info.split_count:05d}' suffix llama.cpp needs to find the others"
        )
    if f.split_count > 1 and info.split_count != f.split_count:
        return f"the file names promise {f.split_count} parts but the header of part 1 says {info.split_count}"
    return None


def _name(kept: list[tuple[Found, GGUFInfo | None, str | None, bool]], cache: HeaderCache) -> tuple[ModelEntry, ...]:
    bases = [(f.names[0] if f.names else base_id(info, f.stem), (f.source.rank, str(f.path))) for f, info, *_ in kept]
    ids = unique_ids(bases)
    entries = []
    for model_id, (f, info, error, partial) in zip(ids, kept):
        extra = {"aliases": list(f.names[1:])} if len(f.names) > 1 else {}
        entries.append(
            ModelEntry(
                id=model_id,
                path=f.path,
                source=f.source.name,
                size_bytes=f.size,
                files=f.files,
                info=info,
                error=error,
                extra=extra,
                incomplete=partial,
                projector=projector_of(f, cache) if info is not None and not info.embeddings else None,
            )
        )
    entries.sort(key=lambda e: (e.id.lower(), e.id))
    return tuple(entries)


def _snapshot(entries: tuple[ModelEntry, ...], incomplete: tuple[IncompleteFile, ...] = ()) -> _Snapshot:
    by_id = {e.id: e for e in entries}
    folded: dict[str, ModelEntry] = {e.id.lower(): e for e in entries}
    for e in entries:
        for alias in e.extra.get("aliases", ()):
            folded.setdefault(alias.lower(), e)
    return _Snapshot(entries, by_id, folded, incomplete)
