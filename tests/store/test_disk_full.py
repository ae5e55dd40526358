"""A full disk (issue 15 C): what the client is told is stored is stored, or the request fails 507.

The service's home is a real 4 MiB tmpfs, filled up with a file while the service runs. Mounting
needs root; elsewhere the test falls back to SQLite's own page cap (`PRAGMA max_page_count`), which
fails a write with the same SQLITE_FULL a full disk gives, and says so in its output
(`LMSP_TEST_NO_TMPFS=1` takes the fallback as root too).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from support import TINY_ID, LiveDaemon, events, start_daemon

from lmsp_tray.store import database


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path | None]:
    point = tmp_path / "disk"
    point.mkdir()
    mounted = (
        getattr(os, "geteuid", lambda: -1)() == 0  # POSIX root: a real tmpfs can be mounted
        and not os.environ.get("LMSP_TEST_NO_TMPFS")
        and (subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(point)]).returncode == 0)
    )
    try:
        yield point if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(point)], check=False)


def fill(folder: Path) -> Path:
    """Write a file into `folder` until the disk is full; the file, to free the space later."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):  # big blocks, then the last bytes
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def full_disk_service(
    small_disk: Path | None, models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LiveDaemon, Callable[[], None], Callable[[], None], bool]]:
    """A live service whose data folder can be made full (`make_full`) and free again (`free`)."""
    home = small_disk or tmp_path / "home"
    monkeypatch.setenv("LMSP_TRAY_HOME", str(home))
    state: dict[str, object] = {}
    if small_disk is None:
        print("not root or no tmpfs: the disk is simulated with SQLite's max_page_count (the same SQLITE_FULL)")
        real_open = database.Database._open_writer

        def capped(self: database.Database) -> object:
            conn = real_open(self)
            state["conn"] = conn
            return conn

        monkeypatch.setattr(database.Database, "_open_writer", capped)
    live = start_daemon(models_dir)

    def make_full() -> None:
        if small_disk is not None:
            state["filler"] = fill(home)
        else:
            conn = state["conn"]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]  # type: ignore[attr-defined]
            live.daemon.db.write_sync(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))

    def free() -> None:
        if small_disk is not None:
            Path(str(state.pop("filler"))).unlink()
        else:
            live.daemon.db.write_sync(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))

    try:
        yield live, make_full, free, small_disk is None
    finally:
        with contextlib.suppress(Exception):
            if "filler" in state:
                free()
        live.stop()


def test_stored_answers_are_stored_or_refused_507(full_disk_service) -> None:
    live, make_full, free, simulated = full_disk_service
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=60) as c:
        body = {"model": TINY_ID, "input": "remember this " * 3, "max_output_tokens": 8, "store": True}
        assert c.post("/responses", json=body).status_code == 200  # the model is loaded, the store works
        make_full()
        answered, refused = [], 0
        for i in range(12):
            r = c.post("/responses", json={**body, "input": f"{i} " + "remember this " * 3})
            if r.status_code == 200:
                answered.append(r.json()["id"])
                continue
            assert r.status_code == 507, r.text
            doc = r.json()
            assert doc["code"] == "insufficient_storage" and "disk" in doc["detail"]
            assert r.headers["content-type"].startswith("application/problem+json")
            refused += 1
        assert refused, "the full disk refused nothing: the test did not reach it"
        for rid in answered:  # whatever was answered 200 is kept
            assert c.get(f"/responses/{rid}").status_code == 200

        # A streamed response ends with response.failed naming the full disk, never response.completed.
        with c.stream("POST", "/responses", json={**body, "stream": True}) as r:
            got = events(r)
        assert got[-1].event == "response.failed", [e.event for e in got]
        assert got[-1].data["error"]["code"] == "insufficient_storage"

        # Other writes: the same clear 507, never 500.
        others = [
            c.post("/tasks", json={"model": TINY_ID, "input": "x", "max_output_tokens": 1}),
            c.post("/auth/tokens", json={"name": "full", "scopes": ["models:read"]}),
        ]
        for r in others:
            if r.status_code < 300 and simulated:  # SQLite's page cap still lets freed pages be reused
                continue
            assert r.status_code == 507 and r.json()["code"] == "insufficient_storage", r.text
        # Reads still work, and a response without `store` is answered as ever.
        assert c.get("/models").status_code == 200
        assert c.post("/responses", json={**body, "store": False}).status_code == 200

        free()
        r = c.post("/responses", json=body)
        assert r.status_code == 200 and c.get(f"/responses/{r.json()['id']}").status_code == 200


def test_the_store_says_storage_full_as_an_enospc_oserror(tmp_path: Path) -> None:
    from lmsp_tray.store.errors import StorageFull

    err = StorageFull(tmp_path / "x.sqlite3")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and "full" in str(err)
