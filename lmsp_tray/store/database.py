"""One SQLite database in WAL mode, written through a single writer thread.

Why this shape: SQLite allows one writer at a time. Instead of letting every
request thread fight over the write lock (and retry on SQLITE_BUSY), one
thread owns the only write connection and runs the write functions callers
submit, in submission order. Whatever is queued when the writer comes round
is committed in one transaction (group commit), so many small writes — an
event per generated token, from several streams at once — share one fsync.
Each write function still runs in its own savepoint: one that raises is
rolled back alone and its caller gets the exception, the others commit.
A caller's future resolves only *after* the COMMIT that made its write
durable, so "written, then sent" holds.

Readers never queue behind the writer: each reading thread has its own
read-only connection (WAL lets readers see the last committed state while
the writer works). `aread`/`awrite` let asyncio code use both without
blocking the event loop.

Durability: `synchronous=FULL` by default. In WAL mode NORMAL already
survives a process kill (SIGKILL) without losing a committed transaction,
because a commit is in the OS page cache once `write()` returns; only a
power cut or kernel crash can roll back the last commits. LMSP promises
that a client never sees an event that is later lost, and an event is sent
right after its commit, so FULL (fsync of the WAL on every commit) keeps
that promise through power loss too. Group commit makes the fsync cost per
batch, not per event; `benchmarks/store_events.py` prints both modes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

from lmsp_tray.private import private_file, tighten
from lmsp_tray.store.errors import NotOurDatabase, StorageFull, StoreClosed, StoreError
from lmsp_tray.store.migrations import MIGRATIONS, migrate

log = logging.getLogger(__name__)

T = TypeVar("T")

APPLICATION_ID = 0x4C4D5350  # "LMSP": marks the file as ours
SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")


@dataclass
class WriterStats:
    """What the writer thread has done (read them for tests and benchmarks)."""

    transactions: int = 0  # COMMITs that succeeded
    writes: int = 0  # write functions that committed
    failed: int = 0  # write functions that raised (rolled back alone)
    largest_group: int = 0  # most write functions in one transaction
    group_retries: int = 0  # groups whose COMMIT failed and were re-run one by one


@dataclass
class _Write:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: Future

    def __call__(self, conn: sqlite3.Connection) -> Any:
        return self.fn(conn, *self.args, **self.kwargs)


class _GroupFailed(Exception):
    """The shared transaction was lost; its writes must be re-run one by one."""


_STOP = object()


class Database:
    """The service's SQLite database: migrations on open, one writer, many readers.

    Write functions receive the write connection as their first argument and
    run inside a transaction the writer manages: they must not BEGIN, COMMIT
    or ROLLBACK, should be short, and must only touch the database (in the
    rare case a group's COMMIT fails, its functions are run again one by one).
    Read functions receive a read-only connection inside one read
    transaction, so all their SELECTs see one snapshot.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = 10.0,
        max_group: int = 512,
        read_threads: int = 4,
        migrations: Sequence[Callable[[sqlite3.Connection], None]] | None = None,
    ) -> None:
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}")
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self.busy_timeout_s = busy_timeout_s
        self.max_group = max(1, max_group)
        self.stats = WriterStats()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        self._closed = False
        self._local = threading.local()
        self._readers_lock = threading.Lock()
        self._reader_conns: list[sqlite3.Connection] = []
        self._conn = self._open_writer()
        try:
            self.schema_version = migrate(self._conn, MIGRATIONS if migrations is None else migrations, self.path)
        except BaseException:
            self._conn.close()
            raise
        self._read_pool = ThreadPoolExecutor(max_workers=max(1, read_threads), thread_name_prefix="lmsp-store-read")
        self._thread = threading.Thread(target=self._writer_loop, name="lmsp-store-writer", daemon=True)
        self._thread.start()

    # ---- opening -------------------------------------------------------------------------

    def _open_writer(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        private_file(self.path, create=True)  # SQLite gives its -wal and -shm the database's mode
        conn = sqlite3.connect(
            str(self.path), isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_s
        )
        try:
            conn.row_factory = sqlite3.Row
            conn.text_factory = _text
            try:
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                raise NotOurDatabase(f"{self.path} is not an SQLite database ({exc})") from None
            if app_id not in (0, APPLICATION_ID):
                raise NotOurDatabase(f"{self.path} is an SQLite database of another application")
            if app_id == 0 and not fresh and _has_foreign_tables(conn):
                raise NotOurDatabase(f"{self.path} is an SQLite database of another application")
            if fresh:
                # Only possible before the first table exists: lets housekeeping give pages back.
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"could not switch the database to WAL mode (got {mode!r})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_size_limit = 16777216")  # WAL file shrinks back to 16 MiB
            if app_id == 0:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            tighten(self.path.with_name(self.path.name + suffix) for suffix in ("-wal", "-shm"))
        except BaseException:
            conn.close()
            raise
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise StoreClosed("the database is closed")
        uri = self.path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_s
        )
        conn.row_factory = sqlite3.Row
        conn.text_factory = _text
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        conn.execute("PRAGMA query_only = ON")
        with self._readers_lock:
            self._reader_conns.append(conn)
        self._local.conn = conn
        return conn

    # ---- writing -------------------------------------------------------------------------

    def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(conn, *args, **kwargs)`` for the writer; the future resolves after COMMIT."""
        future: Future = Future()
        with self._submit_lock:
            if self._closed:
                raise StoreClosed("the database is closed")
            self._queue.put(_Write(fn, args, kwargs, future))
        return future

    def write_sync(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a write and wait for its commit; returns what ``fn`` returned."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("write_sync called from inside a write function (it would wait for itself)")
        return self.write(fn, *args, **kwargs).result()

    async def awrite(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`write` for asyncio code: awaits the commit without blocking the event loop."""
        return await asyncio.wrap_future(self.write(fn, *args, **kwargs))

    def _writer_loop(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is _STOP:
                break
            group = [item]
            while len(group) < self.max_group:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                group.append(nxt)
            group = [w for w in group if w.future.set_running_or_notify_cancel()]
            if not group:
                continue
            try:
                self._run_group(group)
            except BaseException as exc:  # never let the writer thread die with futures pending
                log.exception("store writer: unexpected failure")
                self._rollback()
                for w in group:
                    if not w.future.done():
                        w.future.set_exception(self._as_store_error(exc))

    def _run_group(self, group: list[_Write]) -> None:
        if len(group) == 1:
            self._run_alone(group[0])
            return
        try:
            outcomes = self._try_group(group)
        except _GroupFailed:
            self.stats.group_retries += 1
            for w in group:
                self._run_alone(w)
            return
        self.stats.transactions += 1
        self.stats.largest_group = max(self.stats.largest_group, len(group))
        for w, ok, value in outcomes:
            if ok:
                self.stats.writes += 1
                w.future.set_result(value)
            else:
                self.stats.failed += 1
                w.future.set_exception(self._as_store_error(value))

    def _try_group(self, group: list[_Write]) -> list[tuple[_Write, bool, Any]]:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _GroupFailed from exc
        outcomes: list[tuple[_Write, bool, Any]] = []
        for w in group:
            conn.execute("SAVEPOINT w")
            try:
                value = w(conn)
            except Exception as exc:
                if not conn.in_transaction:  # SQLite rolled the whole transaction back
                    raise _GroupFailed from exc
                conn.execute("ROLLBACK TO w")
                conn.execute("RELEASE w")
                outcomes.append((w, False, exc))
                continue
            if not conn.in_transaction:
                raise _GroupFailed  # the function ended the transaction itself
            conn.execute("RELEASE w")
            outcomes.append((w, True, value))
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise _GroupFailed from exc
        return outcomes

    def _run_alone(self, w: _Write) -> None:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            value = w(conn)
            if not conn.in_transaction:
                raise StoreError("a write function ended the writer's transaction itself")
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - handed to the caller through its future
            self._rollback()
            self.stats.failed += 1
            w.future.set_exception(self._as_store_error(exc))
            return
        self.stats.transactions += 1
        self.stats.writes += 1
        self.stats.largest_group = max(self.stats.largest_group, 1)
        w.future.set_result(value)

    def _as_store_error(self, exc: BaseException) -> BaseException:
        """SQLite's "database or disk is full" (or the OS's ENOSPC/EDQUOT) as `StorageFull`."""
        if isinstance(exc, StorageFull) or not _disk_full(exc):
            return exc
        log.error("store writer: the disk holding %s is full; the write was not kept", self.path)
        full = StorageFull(self.path)
        full.__cause__ = exc
        return full

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("store writer: ROLLBACK failed")

    # ---- reading -------------------------------------------------------------------------

    def read(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, *args, **kwargs)`` on this thread's read-only connection, in one snapshot.

        A read inside another read on the same thread shares its snapshot.
        """
        if self._closed:
            raise StoreClosed("the database is closed")
        conn = self._reader()
        if conn.in_transaction:
            return fn(conn, *args, **kwargs)
        conn.execute("BEGIN")
        try:
            return fn(conn, *args, **kwargs)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    async def aread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`read` for asyncio code, run on the store's reader threads."""
        if self._closed:
            raise StoreClosed("the database is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, lambda: self.read(fn, *args, **kwargs))

    # ---- maintenance ---------------------------------------------------------------------

    def integrity_check(self) -> str:
        """``"ok"`` when SQLite finds the file sound, else its first complaints."""
        rows = self.read(lambda c: c.execute("PRAGMA integrity_check").fetchall())
        return "; ".join(str(r[0]) for r in rows[:10])

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop taking writes, commit everything already queued, then close every connection."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("close called from inside a write function")
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()
        # Anything submitted after _STOP cannot exist (the flag was set under the same lock).
        self._read_pool.shutdown(wait=True)
        with self._readers_lock:
            conns, self._reader_conns = self._reader_conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        try:
            self._conn.execute("PRAGMA optimize")
        except sqlite3.Error:
            pass
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(data: bytes) -> str:
    """A TEXT value as str: bytes that are not UTF-8 (written by something else, or by an older
    version) read as U+FFFD instead of failing the whole read, so one bad value never breaks a listing."""
    return data.decode("utf-8", errors="replace")


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _has_foreign_tables(conn: sqlite3.Connection) -> bool:
    """True for a file that has tables but never had our schema (user_version 0)."""
    if int(conn.execute("PRAGMA user_version").fetchone()[0]) != 0:
        return False
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone() is not None
