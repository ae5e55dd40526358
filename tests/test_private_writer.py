"""The one atomic private writer: many writers at once, and a reader always finds one whole version.

`lmsp-tray open` run twice at once writes the console's redirect page twice at once; two threads
of the service write `instance.json`. A writer that shared one temporary name could truncate the
other's half-written file or move it away under it (a crash: FileNotFoundError), and a reader
could find a mix of two versions.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from lmsp_tray.private import write_private

ROUNDS = 300
WRITERS = 4


def whole_versions(target: Path, write: Callable[[Path, str], None]) -> tuple[list[BaseException], set[str]]:
    """Writers and a reader at once on `target`: (what the writers raised, every odd content read)."""
    failures: list[BaseException] = []
    torn: set[str] = set()
    done = threading.Event()
    write(target, "v" * 1000)

    def writer(n: int) -> None:
        try:
            for round_ in range(ROUNDS):
                mark = f"<{n}:{round_}>"
                write(target, mark * (4096 // len(mark) + n * 50))  # versions of different lengths
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    def reader() -> None:
        while not done.is_set():
            text = target.read_text(encoding="utf-8")
            unit = text[: text.index(">") + 1] if ">" in text else text[:1]
            if not unit or text != unit * (len(text) // len(unit)):
                torn.add(text[:80])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    return failures, torn


def test_concurrent_writers_leave_one_whole_version(tmp_path: Path) -> None:
    target = tmp_path / "console-open.html"
    failures, torn = whole_versions(target, write_private)
    assert failures == [] and torn == set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["console-open.html"]  # no temporary file left behind
    if os.name == "posix":
        assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_new_file_is_private_whatever_the_umask_and_a_mode_is_kept(tmp_path: Path) -> None:
    if os.name != "posix":
        pytest.skip("file modes are POSIX's")
    old = os.umask(0o277)  # would take the owner's write bit
    try:
        write_private(tmp_path / "a", "secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
    write_private(tmp_path / "b", b"shared", mode=0o644)  # config.toml keeps the mode its owner gave it
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o644 and (tmp_path / "b").read_bytes() == b"shared"


def test_a_link_at_the_temporary_name_is_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    names = iter(["planted", "fresh"])
    monkeypatch.setattr("lmsp_tray.private.secrets.token_hex", lambda n: next(names))
    target = tmp_path / "instance.json"
    (tmp_path / f".instance.json.{os.getpid()}.planted.tmp").symlink_to(victim)
    write_private(target, "{}")
    assert target.read_text() == "{}" and victim.read_text() == "untouched"
