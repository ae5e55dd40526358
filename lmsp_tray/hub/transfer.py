"""Fetching one file into the cache: resumable, verified, and shared by every pull that wants it.

`fetch_blob` brings one file of a repository to ``blobs/<etag>``:

- **resumable**: bytes go to ``blobs/<etag>.incomplete`` and a later call (after
  a network cut, Ctrl+C, a service restart) asks for the rest with a ``Range``
  request; a connection that breaks mid-file is resumed at once, a few times,
  with a growing pause; a server that ignores the range restarts the file;
- **verified**: the bytes are hashed as they arrive (a resumed partial is
  hashed from disk first) and compared with what the Hub lists — the SHA-256
  of an LFS file, else the git blob id — and the size; a mismatch deletes the
  partial file and raises `VerificationFailed`. Only a verified file becomes
  the blob;
- **shared**: across processes, the lock ``.locks/…/<etag>.lock`` (the one
  ``huggingface_hub`` takes) lets one writer at a time; a waiter reports the
  other writer's progress and, once it is done, verifies the blob and uses it.
  In one process `Transfers` runs one transfer per blob for any number of
  pulls; it stops only when every pull following it has cancelled.

The snapshot link is not made here: `pull` links all files of a pull together
once every one is verified, so a split model is never seen half there.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock

from lmsp_tray.errors import LMSPError
from lmsp_tray.hub.cache import RepoCache
from lmsp_tray.hub.errors import DownloadCancelled, HubUnavailable, VerificationFailed
from lmsp_tray.hub.remote import HubClient, Location, RangeNotSatisfiable, RetryLater, interrupt
from lmsp_tray.hub.space import disk_full

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger("lmsp_tray.hub")

MAX_ATTEMPTS = 6  # consecutive failed attempts (no byte received) before giving up
MAX_PAUSE_S = 30.0
HASH_BLOCK = 4 << 20


@dataclass(frozen=True)
class FileSpec:
    """One file to fetch: where it is on the Hub and what it must be."""

    repo_id: str
    commit: str
    path: str
    size: int
    sha256: str | None = None
    blob_id: str | None = None

    @property
    def etag(self) -> str:
        """The blob's name in the cache (what the Hub's ETag says)."""
        name = self.sha256 or self.blob_id
        if not name:
            raise HubUnavailable(f"The Hub listed no hash for {self.path}; it cannot be verified.")
        return name


@dataclass(frozen=True)
class FileProgress:
    path: str
    done: int  # bytes of the file in place (a resumed part included)
    total: int
    fetched: int  # bytes received over the network by this transfer (for the speed)
    phase: str  # "checking" (hashing a resumed part) | "downloading" | "waiting" | "verifying"


Report = Callable[[FileProgress], None]


class CancelToken:
    """Set once to stop a pull; `reason` goes into the error (e.g. "shutdown")."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason = "cancelled"

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.debug("cancel callback failed", exc_info=True)

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when cancelled (at once if already); returns a function that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


# -- one file -------------------------------------------------------------------------------------
class _Hasher:
    """SHA-256 for LFS files, the git blob id (SHA-1 of "blob <size>\\0" + content) for the others."""

    def __init__(self, spec: FileSpec) -> None:
        self.spec = spec
        self._h: Any
        if spec.sha256:
            self.kind, self._h = "SHA-256", hashlib.sha256()
        elif spec.blob_id:
            self.kind, self._h = "git blob id", hashlib.sha1(f"blob {spec.size}\0".encode(), usedforsecurity=False)
        else:
            self.kind, self._h = "size", None

    def update(self, data: bytes | memoryview) -> None:
        if self._h is not None:
            self._h.update(data)

    def mismatch(self) -> str | None:
        """What is wrong with the bytes hashed so far, or None when they are the file the Hub describes."""
        if self._h is None:
            return None
        expected = self.spec.sha256 or self.spec.blob_id
        got = self._h.hexdigest()
        return None if got == expected else f"its {self.kind} is {got}, the Hub says {expected}"


def _hash_file(path: Path, hasher: _Hasher, length: int, report: Callable[[int], None], cancel: CancelToken) -> None:
    done = 0
    with open(path, "rb") as f:
        while done < length:
            if cancel.cancelled:
                raise DownloadCancelled(cancel.reason)
            block = f.read(min(HASH_BLOCK, length - done))
            if not block:
                raise OSError(errno.EIO, f"{path.name} shrank while it was being read")
            hasher.update(block)
            done += len(block)
            report(done)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _other_partial_size(cache: RepoCache, etag: str) -> int:
    """How far another writer has got (ours is ``<etag>.incomplete``; huggingface_hub's ``<etag>.<id>.incomplete``)."""
    best = 0
    try:
        for entry in os.scandir(cache.blob(etag).parent):
            if entry.name.startswith(etag) and entry.name.endswith(".incomplete"):
                best = max(best, entry.stat().st_size)
    except OSError:
        pass
    return best


def fetch_blob(client: HubClient, cache: RepoCache, spec: FileSpec, report: Report, cancel: CancelToken) -> Path:
    """Make ``blobs/<etag>`` the verified file `spec` describes; returns the blob's path."""
    etag = spec.etag
    blob = cache.blob(etag)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock_path = cache.lock(etag)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_path), mode=0o664)
    while True:
        if cancel.cancelled:
            raise DownloadCancelled(cancel.reason)
        try:
            lock.acquire(timeout=0.5)
            break
        except filelock.Timeout:  # another program writes this blob: follow it
            report(FileProgress(spec.path, _other_partial_size(cache, etag), spec.size, 0, "waiting"))
    try:
        if _size(blob) is not None and _verify_existing(blob, spec, report, cancel):
            return blob
        _download(client, cache, spec, report, cancel)
        return blob
    finally:
        lock.release()


def _verify_existing(blob: Path, spec: FileSpec, report: Report, cancel: CancelToken) -> bool:
    """A blob already there (another pull, another tool): keep it if it is right, else delete it."""
    hasher = _Hasher(spec)
    size = _size(blob) or 0
    if size == spec.size:
        _hash_file(blob, hasher, size, lambda n: report(FileProgress(spec.path, n, spec.size, 0, "verifying")), cancel)
        if hasher.mismatch() is None:
            return True
    log.warning("the cached blob of %s is damaged; fetching it again", spec.path)
    blob.unlink(missing_ok=True)
    return False


def _download(client: HubClient, cache: RepoCache, spec: FileSpec, report: Report, cancel: CancelToken) -> None:
    import httpx2  # loaded with huggingface_hub, on the first download (`remote`)

    partial, blob = cache.partial(spec.etag), cache.blob(spec.etag)
    have = _size(partial) or 0
    if have > spec.size:
        log.info("%s: the partial file is longer than the file; starting over", spec.path)
        partial.unlink()
        have = 0
    hasher = _Hasher(spec)
    if have:
        _hash_file(
            partial, hasher, have, lambda n: report(FileProgress(spec.path, n, spec.size, 0, "checking")), cancel
        )
    fetched = 0
    failures = 0
    location: Location | None = None
    report(FileProgress(spec.path, have, spec.size, 0, "downloading"))
    while have < spec.size:
        if cancel.cancelled:
            raise DownloadCancelled(cancel.reason)
        progressed = False
        try:
            if location is None:
                location = client.locate(spec.repo_id, spec.commit, spec.path)
                if location.etag != spec.etag:
                    raise HubUnavailable(
                        f"The Hub describes {spec.path} differently from its listing (ETag {location.etag}); "
                        "try again in a moment."
                    )
            with client.open(location, have) as (ranged, response), _interruptible(response, cancel):
                if not ranged:  # the server sent the whole file: start over
                    have, hasher = 0, _Hasher(spec)
                with open(partial, "r+b" if partial.exists() else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    for chunk in response.iter_bytes():
                        if cancel.cancelled:
                            raise DownloadCancelled(cancel.reason)
                        if have + len(chunk) > spec.size:
                            raise HubUnavailable(f"The server sent more bytes of {spec.path} than the file has.")
                        out.write(chunk)
                        hasher.update(chunk)
                        have += len(chunk)
                        fetched += len(chunk)
                        progressed = True
                        report(FileProgress(spec.path, have, spec.size, fetched, "downloading"))
            if have < spec.size:
                raise httpx2.RemoteProtocolError("the connection ended before the whole file arrived")
        except RangeNotSatisfiable:
            if have != spec.size:  # the server has less than our partial: start over
                partial.unlink(missing_ok=True)
                have, hasher = 0, _Hasher(spec)
        except (httpx2.TransportError, RetryLater) as exc:
            if cancel.cancelled:  # the cancel itself broke the connection
                raise DownloadCancelled(cancel.reason) from None
            failures = 0 if progressed else failures + 1
            if failures >= MAX_ATTEMPTS:
                raise HubUnavailable(
                    f"The download of {spec.path} kept failing ({_short(exc)}); the {have:,} bytes fetched are "
                    "kept: pull again to resume."
                ) from None
            pause = min(MAX_PAUSE_S, 0.5 * 2**failures)
            log.info("%s: %s; resuming at byte %d in %.1f s", spec.path, _short(exc), have, pause)
            if cancel.wait(pause):
                raise DownloadCancelled(cancel.reason) from None
            if isinstance(exc, RetryLater):
                location = None  # a refused (perhaps expired) download URL: ask the Hub for a fresh one
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise disk_full(cache.root, have, spec.size) from None
            raise
        except LMSPError:
            raise
    problem = hasher.mismatch()
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise VerificationFailed(
            f"{spec.path} arrived damaged: {problem}. The downloaded file was deleted and nothing was added to "
            "your models; pull again.",
            extra={"file": spec.path},
        )
    report(FileProgress(spec.path, have, spec.size, fetched, "verifying"))
    with open(partial, "rb+") as out:
        os.fsync(out.fileno())
    os.replace(partial, blob)


@contextlib.contextmanager
def _interruptible(response: httpx2.Response, cancel: CancelToken) -> Iterator[None]:
    """A cancel breaks the connection at once, instead of waiting for the next bytes (or a timeout)."""
    forget = cancel.on_cancel(lambda: interrupt(response))
    try:
        yield
    finally:
        forget()


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]


# -- sharing ------------------------------------------------------------------------------------------
class _Transfer:
    """One blob being fetched on its own thread, followed by any number of pulls."""

    def __init__(self, key: Path, work: Callable[[Report, CancelToken], Path]) -> None:
        self.key = key
        self._work = work
        self._token = CancelToken()
        self._lock = threading.Lock()
        # Held while progress is handed out, so a new follower's first report (the last one known)
        # reaches it before any newer one: its progress never goes back. Reentrant: a follower may
        # leave from inside its report.
        self._sending = threading.RLock()
        self._listeners: list[tuple[CancelToken, Report]] = []
        self._last: FileProgress | None = None
        self.done = threading.Event()
        self.result: Path | None = None
        self.error: BaseException | None = None

    @property
    def stopping(self) -> bool:
        return self._token.cancelled

    def start(self) -> None:
        threading.Thread(target=self._run, name="lmsp-download", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._work(self._report, self._token)
        except BaseException as exc:  # noqa: BLE001 - handed to every follower
            self.error = exc
        finally:
            self.done.set()

    def _report(self, progress: FileProgress) -> None:
        with self._sending:
            with self._lock:
                self._last = progress
                listeners = [report for _, report in self._listeners]
            for report in listeners:
                try:
                    report(progress)
                except Exception:  # a follower's bug must not stop the transfer
                    log.exception("download progress listener failed")

    def follow(self, cancel: CancelToken, report: Report) -> None:
        with self._sending:
            with self._lock:
                self._listeners.append((cancel, report))
                last = self._last
            if last is not None:
                report(last)

    def leave(self, cancel: CancelToken) -> None:
        with self._lock:
            self._listeners = [(c, r) for c, r in self._listeners if c is not cancel]
            if not self._listeners and not self.done.is_set():
                self._token.cancel(cancel.reason)


class Transfers:
    """The transfers of this process, one per blob: a second pull of a file follows the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[Path, _Transfer] = {}

    def fetch(
        self, key: Path, work: Callable[[Report, CancelToken], Path], report: Report, cancel: CancelToken
    ) -> Path:
        """Run `work` for `key` unless a transfer of it runs already, and follow it until done or `cancel`."""
        while True:
            with self._lock:
                transfer = self._active.get(key)
                fresh = transfer is None or transfer.done.is_set()
                if fresh:
                    transfer = self._active[key] = _Transfer(key, work)
                assert transfer is not None
            if not fresh and transfer.stopping:  # everyone left it: let it end, then start anew
                transfer.done.wait()
                continue
            break
        transfer.follow(cancel, report)
        if fresh:
            transfer.start()
        try:
            while not transfer.done.wait(0.1):
                if cancel.cancelled:
                    raise DownloadCancelled(cancel.reason)
        finally:
            transfer.leave(cancel)
            with self._lock:
                if transfer.done.is_set() and self._active.get(key) is transfer:
                    del self._active[key]
        if transfer.error is not None:
            raise _copy(transfer.error)
        assert transfer.result is not None
        return transfer.result

    def active(self) -> int:
        with self._lock:
            return sum(1 for t in self._active.values() if not t.done.is_set())


def _copy(error: BaseException) -> BaseException:
    """The transfer's error for one follower (each raises its own object; the traceback stays with it)."""
    if isinstance(error, LMSPError):
        clone: Any = type(error)(error.detail, param=error.param, headers=error.headers, extra=error.extra)
        return clone
    return error
