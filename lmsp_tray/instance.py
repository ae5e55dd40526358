"""The running instance, as other processes see it: one per home, found and asked to show itself.

Why a module of its own: a second `lmsp-tray`, the token CLI and uninstall all need to know
whether a service runs for this home, where, and how to reach it, without importing uvicorn or
llama.cpp.

- **One instance per home** is guaranteed by `InstanceLock`: an exclusive lock (`flock` on POSIX,
  `msvcrt.locking` on Windows) on `lmsp-tray.lock` in the data folder, taken before the database
  is opened or the port bound and held until the process ends (the OS drops it even after
  SIGKILL). The data folder, not the runtime folder, because it is what the lock protects (the
  database) and it does not change with `XDG_RUNTIME_DIR` from one terminal to another.
- **`instance.json`** next to the lock (0600) says who holds it: `role` (`service`, or `command`
  for a `tokens` command working on the data folder for a moment), pid, start time, and once
  bound the URL and the runtime folder (where the discovery file and, without a keyring, the
  owner token file are). It is advisory; the lock is the truth.
- **`service.json`** (the discovery file, 0600) in the runtime folder is the public contract for
  apps: written once the socket is bound, removed on a clean exit. Whether the service these files
  name answers is asked over HTTP by `lmsp_tray.client.finding`, not here: this module only
  reads and writes files, locks and signals.
- **Show yourself**: `ask_to_show` sends `SHOW_SIGNAL` (SIGUSR1) to the holder; `ShowRequests`
  is the receiving end, installed right after the lock is taken (before the pid is published, so
  the signal never meets its default action, which would end the process). The tray sets what a
  request does (open its menu); a headless service raises a notification; the console page may
  make it open the page. Windows has no such signal: there `ask_to_show` returns False and the
  second process says where the service runs itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from lmsp_tray import __version__
from lmsp_tray.config import Paths
from lmsp_tray.private import write_private

log = logging.getLogger("lmsp_tray.instance")

LOCK_NAME = "lmsp-tray.lock"
INFO_NAME = "instance.json"
SERVICE = "service"
COMMAND = "command"
SHOW_SIGNAL: int | None = getattr(signal, "SIGUSR1", None)


# -- the lock ---------------------------------------------------------------------------------------


def lock_file(paths: Paths) -> Path:
    return paths.data_dir / LOCK_NAME


def info_file(paths: Paths) -> Path:
    return paths.data_dir / INFO_NAME


class InstanceBusy(RuntimeError):
    """Another process holds this home's instance lock."""


class InstanceLock:
    """The exclusive per-home lock. `acquire()` once; the lock lives until `release()` or exit."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self._fh: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another process holds it."""
        if self._fh is not None:
            return True
        path = lock_file(self.paths)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fh = os.fdopen(fd, "r+b", buffering=0)
        try:
            _lock(fh)
        except OSError:
            fh.close()
            return False
        self._fh = fh
        return True

    def wait(self, timeout: float, interval: float = 0.05) -> bool:
        """Take the lock, waiting up to `timeout` seconds for its holder to let go."""
        deadline = time.monotonic() + timeout
        while not self.acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
        return True

    def release(self) -> None:
        fh, self._fh = self._fh, None
        if fh is None:
            return
        with contextlib.suppress(OSError):
            info = read_info(self.paths)
            if info is not None and info.pid == os.getpid():
                info_file(self.paths).unlink()
        with contextlib.suppress(OSError):
            _unlock(fh)
        fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock(fh: IO[bytes]) -> None:
    if sys.platform == "win32":
        import msvcrt

        fh.seek(0)
        msvcrt.locking(fh.fileno(), msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
    else:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unlock(fh: IO[bytes]) -> None:
    if sys.platform == "win32":
        import msvcrt

        fh.seek(0)
        msvcrt.locking(fh.fileno(), msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
    else:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# -- who holds it -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceInfo:
    """What the lock holder says about itself (`instance.json`)."""

    role: str  # SERVICE or COMMAND
    pid: int
    started_at: float
    url: str | None = None  # once the socket is bound
    runtime_dir: str | None = None  # where its discovery file (and owner token file) are
    version: str = ""

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if sys.platform == "win32":
        return True  # no cheap check; the lock says whether it runs
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_info(paths: Paths, role: str, *, url: str | None = None) -> None:
    """Atomically write `instance.json` for this process (0600)."""
    doc = {
        "role": role,
        "pid": os.getpid(),
        "started_at": time.time(),
        "url": url,
        "runtime_dir": str(paths.runtime_dir),
        "version": __version__,
    }
    previous = read_info(paths)
    if previous is not None and previous.pid == os.getpid():
        doc["started_at"] = previous.started_at
    _write_private_json(info_file(paths), doc)


def read_info(paths: Paths) -> InstanceInfo | None:
    try:
        doc = json.loads(info_file(paths).read_text(encoding="utf-8"))
        return InstanceInfo(
            role=str(doc["role"]),
            pid=int(doc["pid"]),
            started_at=float(doc.get("started_at") or 0),
            url=str(doc["url"]) if doc.get("url") else None,
            runtime_dir=str(doc["runtime_dir"]) if doc.get("runtime_dir") else None,
            version=str(doc.get("version") or ""),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def service_holder(paths: Paths) -> InstanceInfo | None:
    """The service that holds the lock, if one does (a `tokens` command holding it briefly is not one)."""
    if not lock_is_held(paths):
        return None
    info = read_info(paths)
    if info is None or info.role != SERVICE or not info.alive:
        return None
    return info


def lock_is_held(paths: Paths) -> bool:
    """Whether some process (this one included) holds the lock now."""
    path = lock_file(paths)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    with os.fdopen(fd, "r+b", buffering=0) as fh:
        try:
            _lock(fh)
        except OSError:
            return True
        _unlock(fh)
        return False


def _write_private_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(doc))


def wait_for_url(paths: Paths, holder: InstanceInfo, wait_s: float) -> InstanceInfo:
    """`holder` as it is once it publishes its URL (a starting service binds its socket first), or
    after `wait_s` seconds, or once it ends: whichever comes first (then `url` may still be None)."""
    deadline = time.monotonic() + wait_s
    info = holder
    while info.url is None and time.monotonic() < deadline and info.alive:
        time.sleep(0.1)
        info = read_info(paths) or info
    return info


# -- the discovery file -----------------------------------------------------------------------------


def write_discovery_file(paths: Paths, url: str, owner_token_id: str | None) -> None:
    """Atomically write `service.json` for this process (0600, folder 0700)."""
    paths.discovery_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc: dict[str, object] = {"url": url, "pid": os.getpid(), "version": __version__, "started_at": int(time.time())}
    if owner_token_id:
        doc["owner_token_id"] = owner_token_id
    _write_private_json(paths.discovery_file, doc)


def remove_discovery_file(paths: Paths) -> None:
    """Remove `service.json` if this process wrote it (never another instance's)."""
    path = paths.discovery_file
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
            path.unlink()


# -- show yourself ----------------------------------------------------------------------------------


def ask_to_show(info: InstanceInfo) -> bool:
    """Ask the running service to bring itself forward (its menu, a notification or its page)."""
    if SHOW_SIGNAL is None or not info.alive:
        return False
    try:
        os.kill(info.pid, SHOW_SIGNAL)
    except OSError as exc:
        log.info("could not ask pid %d to show itself: %s", info.pid, exc)
        return False
    return True


class ShowRequests:
    """The receiving end of `ask_to_show`: calls the current handler on a worker thread.

    `install()` from the main thread as soon as the lock is held. Until a handler is set (the
    tray is not up yet) requests are only logged: the starting instance shows itself anyway.
    """

    def __init__(self) -> None:
        self._handler: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def install(self) -> bool:
        if SHOW_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(SHOW_SIGNAL, lambda *_: self.request())
        return True

    def set_handler(self, handler: Callable[[], None] | None) -> None:
        with self._lock:
            self._handler = handler

    @property
    def handler(self) -> Callable[[], None] | None:
        return self._handler

    def request(self) -> None:
        """A second launch asked this instance to show itself (signal context: hand off at once)."""
        with self._lock:
            handler = self._handler
        if handler is None:
            log.info("a second launch asked this instance to show itself while it is starting")
            return
        threading.Thread(target=self._run, args=(handler,), name="lmsp-show", daemon=True).start()

    @staticmethod
    def _run(handler: Callable[[], None]) -> None:
        log.info("a second launch asked this instance to show itself")
        try:
            handler()
        except Exception:
            log.warning("could not show this instance", exc_info=True)
