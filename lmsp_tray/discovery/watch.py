"""Watching the model folders: a new GGUF shows up without a restart, a removed one goes away.

`FolderWatcher` follows the existing source folders with the OS's file
notifications (watchfiles: inotify, FSEvents, ReadDirectoryChangesW) and
rescans the catalog shortly after something changes. It also rescans every
`poll` seconds, which picks up folders that did not exist when it started
(LM Studio installed later) and file systems without notifications.
Listeners get the ids that appeared and disappeared. Writes to a download in
progress (``*.incomplete``, lock files, hidden temporary files) are not changes
worth a rescan: a file being downloaded is written to many times a second, and
is never a model until it is renamed into place.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable

import watchfiles

from lmsp_tray.discovery.catalog import Catalog
from lmsp_tray.discovery.entry import ModelEntry

log = logging.getLogger("lmsp_tray.discovery")

Listener = Callable[[list[ModelEntry], set[str], set[str]], None]  # (entries, added ids, removed ids)
IGNORED_SUFFIXES = (".incomplete", ".lock", ".tmp", ".part", ".download")


def relevant(_change: object, path: str) -> bool:
    """Whether a changed path can change the catalog (not a partial download, a lock or a hidden temp file)."""
    name = os.path.basename(path)
    return not (name.startswith(".") or name.endswith(IGNORED_SUFFIXES))


class FolderWatcher:
    def __init__(self, catalog: Catalog, *, poll: float = 30.0, debounce_ms: int = 300) -> None:
        self._catalog = catalog
        self._poll = poll
        self._debounce_ms = debounce_ms
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._known = {e.id for e in catalog.entries()}
        self._known_state = self._state(catalog.entries())

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lmsp-folder-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def rescan(self) -> list[ModelEntry]:
        """Rescan now and tell listeners what changed (also what the tray's Rescan calls)."""
        entries = self._catalog.scan()
        ids = {e.id for e in entries}
        added, removed = ids - self._known, self._known - ids
        self._known = ids
        state = self._state(entries)
        changed, self._known_state = state != self._known_state, state
        if added or removed:
            log.info("models changed: +%s -%s", sorted(added), sorted(removed))
        if changed:  # also a file that became usable, broke, or is still being copied
            for listener in list(self._listeners):
                try:
                    listener(entries, added, removed)
                except Exception:  # a listener's bug must not stop watching
                    log.exception("model folder listener failed")
        return entries

    def _state(self, entries: list[ModelEntry]) -> tuple:
        """What listeners care about: ids, their errors, and the incomplete files."""
        incomplete = tuple((str(i.path), i.size_bytes) for i in self._catalog.incomplete_files())
        return tuple((e.id, e.error, e.size_bytes) for e in entries), incomplete

    def _roots(self) -> list[str]:
        return sorted({str(s.root) for s in self._catalog.sources if s.exists()})

    def _run(self) -> None:
        while not self._stop.is_set():
            roots = self._roots()
            try:
                if not roots:
                    self._stop.wait(self._poll)
                else:
                    self._watch(roots)
                if not self._stop.is_set():
                    self.rescan()
            except Exception:  # e.g. a folder removed while being watched: start over
                log.debug("folder watch restarting", exc_info=True)
                self._stop.wait(1.0)

    def _watch(self, roots: list[str]) -> None:
        """Rescan on each batch of changes; return when it is time for a periodic pass."""
        changes: Iterable[set] = watchfiles.watch(
            *roots,
            watch_filter=relevant,
            stop_event=self._stop,
            debounce=self._debounce_ms,
            step=50,
            rust_timeout=int(self._poll * 1000),
            yield_on_timeout=True,
            recursive=True,
            raise_interrupt=False,
        )
        for batch in changes:
            if not batch:  # timeout: periodic pass (also notices folders created meanwhile)
                return
            self.rescan()
            if self._roots() != roots:
                return
