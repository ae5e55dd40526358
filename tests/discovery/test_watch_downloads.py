"""The folder watcher ignores a download in progress: a file written many times a second is not a new model."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from lmsp_tray.discovery.catalog import Catalog
from lmsp_tray.discovery.sources import CUSTOM, Source
from lmsp_tray.discovery.watch import FolderWatcher, relevant


def test_partial_downloads_locks_and_hidden_files_are_not_relevant() -> None:
    for path in (
        "/c/blobs/abc.incomplete",
        "/c/.locks/x/abc.lock",
        "/c/snapshots/r/.m.gguf.1f2e.tmp",
        "/m/x.gguf.part",
    ):
        assert not relevant(None, path), path
    for path in ("/c/snapshots/r/m.gguf", "/c/blobs/abc", "/m/sub"):
        assert relevant(None, path), path


def test_writing_a_partial_file_does_not_rescan_but_the_finished_model_does(tmp_path: Path, tiny_gguf: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    catalog = Catalog([Source(CUSTOM, folder)], workers=1)
    watcher = FolderWatcher(catalog, poll=30.0, debounce_ms=50)
    scans: list[float] = []
    original = catalog.scan

    def counting_scan():
        scans.append(time.monotonic())
        return original()

    catalog.scan = counting_scan  # type: ignore[method-assign]
    added = threading.Event()
    watcher.subscribe(lambda _entries, new, _gone: added.set() if new else None)
    watcher.start()
    try:
        time.sleep(0.5)  # the watch is set up
        partial = folder / "tiny.gguf.incomplete"
        with partial.open("wb") as out:
            for _ in range(20):
                out.write(b"x" * 4096)
                out.flush()
                time.sleep(0.02)
        time.sleep(0.5)
        assert scans == [], "a write to a partial download made the catalog rescan"
        partial.unlink()
        time.sleep(0.3)
        assert scans == []
        shutil.copyfile(tiny_gguf, folder / "tiny.gguf")
        assert added.wait(10), "the finished model was not picked up"
    finally:
        watcher.stop()
