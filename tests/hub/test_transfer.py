"""One transfer followed by several pulls: the logic of sharing it, on a scripted transfer.

The transfer itself (HTTP to a fake Hub, resume, verification) is tested in
test_hub_pull.py; here a scripted `work` decides when progress comes, so an
interleaving that a real download meets only by chance is made to happen.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lmsp_tray.hub.transfer import CancelToken, FileProgress, Report, Transfers

pytestmark = pytest.mark.timeout(60)


def progress(done: int) -> FileProgress:
    return FileProgress(path="model.gguf", done=done, total=100, fetched=done, phase="downloading")


def test_a_late_follower_never_sees_its_progress_go_back(tmp_path: Path) -> None:
    """A pull that joins a running transfer gets the last progress known, then the newer ones, in
    that order, even when the transfer reports anew while the joining pull is being told the last."""
    transfers = Transfers()
    key = tmp_path / "blob"
    first_told = threading.Event()  # the joining pull is inside its first report
    newer_sent = threading.Event()  # the transfer's next report returned
    finish = threading.Event()

    def work(report: Report, cancel: CancelToken) -> Path:
        report(progress(10))
        first_told.wait(30)
        report(progress(20))  # while the joining pull is still being told 10
        newer_sent.set()
        finish.wait(30)
        return key

    known = threading.Event()  # the transfer's first progress is known

    def first_report(p: FileProgress) -> None:
        known.set()

    seen: list[int] = []

    def joining_report(p: FileProgress) -> None:
        if not seen and not first_told.is_set():
            first_told.set()
            # The old order: the newer report overtook this one, which then landed after it.
            newer_sent.wait(2)
        seen.append(p.done)

    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(transfers.fetch(key, work, first_report, CancelToken())))
    first.start()
    assert known.wait(30)  # the second pull joins once the first progress is known
    joining = threading.Thread(target=lambda: results.append(transfers.fetch(key, work, joining_report, CancelToken())))
    joining.start()
    newer_sent.wait(30)
    finish.set()
    first.join(30)
    joining.join(30)
    assert results == [key, key]
    assert seen == [10, 20]
