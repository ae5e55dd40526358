"""Files only the user can read (issue 15 item 12): a real `lmsp-tray serve` under a umask of 000
makes its folders 0700 and its database, WAL, shared memory and log 0600, and tightens an existing
install left readable by others."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import free_port, wait_until

from lmsp_tray.cli.main import PrivateLogFile

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def serve(env: dict[str, str], models_dir: Path, port: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "lmsp_tray", "serve", "--port", str(port), "--models-dir", str(models_dir)]
    return subprocess.Popen(  # under the loosest umask: every mode below is the service's own doing
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", *args, "--no-default-dirs"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_once(env: dict[str, str], models_dir: Path) -> None:
    port = free_port()
    with serve(env, models_dir, port) as proc:  # its stderr pipe closed at the end, not left to the collector
        try:
            url = f"http://127.0.0.1:{port}/lmsp/v1"

            def up() -> bool:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
                return httpx.get(url, timeout=1).status_code == 200

            wait_until(up, 60, "the service to answer", interval=0.1, ignoring=httpx.HTTPError)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "user"
    home.mkdir()
    e = {k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR"}}
    e.update({"LMSP_TRAY_HOME": str(tmp_path / "lmsp"), "HOME": str(home), "HF_HOME": str(home / "hf")})
    return e


def private_install(root: Path) -> list[tuple[Path, int]]:
    data, logs = root / "data", root / "cache" / "logs"
    db = data / "lmsp-tray.sqlite3"
    return [
        (data, 0o700),
        (logs, 0o700),
        (root / "cache", 0o700),
        (root / "config", 0o700),
        (root / "run", 0o700),
        (db, 0o600),
        (db.with_name(db.name + "-wal"), 0o600),
        (db.with_name(db.name + "-shm"), 0o600),
        (logs / "lmsp-tray.log", 0o600),
    ]


def test_a_fresh_install_is_private_whatever_the_umask(env: dict[str, str], models_dir: Path) -> None:
    run_once(env, models_dir)
    root = Path(env["LMSP_TRAY_HOME"])
    for path, wanted in private_install(root):
        if path.name.endswith(("-wal", "-shm")) and not path.exists():
            continue  # a clean stop may checkpoint and remove them; their mode is checked while running below
        assert mode(path) == wanted, (path, oct(mode(path)))


def test_an_existing_install_is_tightened_at_start_up(env: dict[str, str], models_dir: Path) -> None:
    root = Path(env["LMSP_TRAY_HOME"])
    run_once(env, models_dir)
    rotated = root / "cache" / "logs" / "lmsp-tray.log.1"
    rotated.write_text("an old log\n")
    db = root / "data" / "lmsp-tray.sqlite3"
    for suffix in ("-wal", "-shm"):  # as another version might have left them
        db.with_name(db.name + suffix).touch()
    for path, wanted in [*private_install(root), (rotated, 0o600)]:
        os.chmod(path, 0o777 if wanted == 0o700 else 0o666)
    port = free_port()
    with serve(env, models_dir, port) as proc:
        try:
            wait_until(lambda: (root / "run" / "service.json").exists(), 60, "the discovery file")
            for path, wanted in [*private_install(root), (rotated, 0o600)]:
                assert mode(path) == wanted, (path, oct(mode(path)))  # the -wal and -shm exist while it runs
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def test_a_rotated_log_file_is_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        handler = PrivateLogFile(tmp_path / "x.log", maxBytes=10, backupCount=2, encoding="utf-8")
        handler.emit(logging.makeLogRecord({"msg": "first line, over ten bytes"}))
        handler.emit(logging.makeLogRecord({"msg": "second line, after a rotation"}))
        handler.close()
    finally:
        os.umask(old)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files][:2] == ["x.log", "x.log.1"]
    assert all(mode(f) == 0o600 for f in files)
