"""Big request bodies are decoded and validated in a worker process, where they cannot hold the service's GIL.

Why a process: decoding a 7 MiB body and validating it takes the interpreter lock for a second or more.
A worker thread frees the event loop but not the lock, and while the lock is held the service relays no
token from its model processes: a stream beside such a body stalled 2.4 s (341 ms without it). In a
process of its own the parse holds that process's lock only; the service's threads keep relaying.

Why `PROCESS_BODY_BYTES` (256 KiB): the hop costs a copy of the body through a pipe and the unpickling
of the validated object, about 1 ms, and each parse there costs nothing of the service's lock beyond
that. In process, a 256 KiB chat body takes about 3-5 ms of the lock (decode and validation), already a
noticeable share of a 20-40 ms token interval; below it, a thread (or the event loop, under
`routes.INLINE_BODY_BYTES`) is cheaper than the hop. Coding agents send bodies of hundreds of KiB on
every turn, so the bodies that stall streams are exactly the ones above it.

Why the object comes back in pieces (`CHUNK_ITEMS`): unpickling the validated object is one C call that
holds the service's lock throughout, 50-60 ms for the 23,000 messages of an 8 MiB conversation. Its long
lists travel as separately pickled slices instead, unpickled one after another on a thread: between two
slices (a few ms each) the lock passes to the threads that relay tokens.

Why long strings come back once (`SHARED_CHARS`, `_Table`): what a parse returns holds each text of
the body twice (the decoded body, kept for idempotency and storage, and the items made from it), and
slices pickled apart share no memo, so each text travelled and was unpickled twice: 15.4 MB for a
7.9 MiB body. Sent once, in a table of strings, it is 8.3 MB, and the service's copy holds each text
once, as the worker's did.

Why at the lowest priority while a model decodes (`priority.aside`, `background`): the worker parses at
full speed on a core the decode wants; with a stream decoding on both cores of a small machine, 8 MiB
bodies arriving every 0.5 s took the stream's longest gap from 0.54 s to 6.1 s at normal priority. The
decode's tokens come first; a body waits for the cycles the decode leaves. On Linux the parse then runs
on a thread of the idle scheduling class (`SCHED_IDLE`): a decode thread that wakes takes its core at
once, and the scheduler counts a core that runs only the parse as free when it places the decode's
threads (at nice 19 it still shares a core by weight and is not always preempted on the spot). While
nothing decodes there is nothing to step aside for, and the idle class would step aside for every other
program as well (a 300 KiB body behind a compile waited seconds), so the parse runs at normal priority;
the choice is made per body (`BodyParser.parse`), on a thread that ends with it, because an unprivileged
thread cannot leave the idle class again. Where threads have no priority of their own (macOS, Windows)
the whole worker is at nice 19 from its start (`priority.start_worker`).

Why one worker, started at the first big body and kept: a spawned interpreter takes a few hundred
milliseconds to start, paid once; one worker is enough to keep the lock free, and on a machine of two
cores a second one would take the decode's other core (big bodies wait for each other instead, as they
did on threads). The daemon closes it when the service stops (`close`); a worker that died (killed for
memory) is replaced at the next body, and the body that found it dead is parsed in process as before.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from lmsp_tray.priority import BACKGROUND_INPUT_BYTES, aside, start_worker
from lmsp_tray.protocol import strict_json

PROCESS_BODY_BYTES = BACKGROUND_INPUT_BYTES  # a body this large or larger is parsed in the worker process
WORKERS = 1

T = TypeVar("T")


def parse_body(parse: Callable[[Any], T], raw: bytes) -> T:
    """`parse` of the body decoded as JSON (`strict_json.loads`): what runs in the worker, and in process.

    `parse` must be a module-level function (it travels to the worker by name); what it returns and the
    typed errors it raises travel back pickled."""
    return parse(strict_json.loads(raw))


CHUNK_ITEMS = 1000  # a list longer than this comes back as pickled slices of this many items
SHARED_CHARS = 256  # a string this long or longer comes back once, however often the object holds it


class _Slicing(pickle.Pickler):
    """Pickles each long list as a list of separately pickled slices (`_Joining` puts it together), and
    with a `table`, each long string as its index there (the table travels once, in `Sliced.strings`)."""

    def __init__(self, file: io.BytesIO, table: _Table | None) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.table = table

    def persistent_id(self, obj: Any) -> Any:
        if self.table is not None and type(obj) is str and len(obj) >= SHARED_CHARS:
            return self.table.index(obj)
        if type(obj) is list and len(obj) > CHUNK_ITEMS:
            return [_dumps(obj[i : i + CHUNK_ITEMS], self.table) for i in range(0, len(obj), CHUNK_ITEMS)]
        return None


class _Table:
    """The long strings of one object, each once: a body's texts are held twice in what a parse returns
    (the decoded body and the items made from it), and slices pickled apart share no pickle memo."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self._at: dict[int, int] = {}  # id -> index (the object being pickled keeps every string alive)

    def index(self, text: str) -> int:
        at = self._at.get(id(text))
        if at is None:
            at = self._at[id(text)] = len(self.strings)
            self.strings.append(text)
        return at


class _Joining(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, strings: list[str] | None) -> None:
        super().__init__(file)
        self.strings = strings

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is int and self.strings is not None:
            return self.strings[pid]
        joined: list[Any] = []
        for piece in pid:  # Python between the pieces: the interpreter lock can pass to other threads here
            joined.extend(_loads(piece, self.strings))
        return joined


def _dumps(obj: Any, table: _Table | None = None) -> bytes:
    out = io.BytesIO()
    _Slicing(out, table).dump(obj)
    return out.getvalue()


def _loads(data: bytes, strings: list[str] | None = None) -> Any:
    return _Joining(io.BytesIO(data), strings).load()


@dataclass(frozen=True)
class Sliced:
    """A parsed body as it comes back: its long strings (a list, itself in slices), then the object."""

    strings: bytes
    obj: bytes

    def load(self) -> Any:
        return _loads(self.obj, _loads(self.strings))


def _sliced(parse: Callable[[Any], Any], raw: bytes) -> Sliced:
    table = _Table()
    obj = _dumps(parse_body(parse, raw), table)
    return Sliced(_dumps(table.strings), obj)


def sliced_parse_body(parse: Callable[[Any], Any], raw: bytes, background: bool = False) -> Sliced:
    """`parse_body` in the worker, its object pickled with long lists in slices and long strings once
    (`Sliced.load` reads it back); with `background`, as work that steps aside (`priority.aside`)."""
    return aside(_sliced, parse, raw) if background else _sliced(parse, raw)


class BodyParser:
    """One long-lived worker process that parses big bodies (`parse`), started at the first of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def _started(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._closed:
                return None
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    WORKERS, mp_context=multiprocessing.get_context("spawn"), initializer=start_worker
                )
            return self._pool

    def _broken(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    @property
    def started(self) -> bool:
        """Whether the worker process has been started (and not closed)."""
        with self._lock:
            return self._pool is not None

    async def parse(self, parse: Callable[[Any], T], raw: bytes, *, background: bool = False) -> T:
        """`parse_body(parse, raw)` in the worker process: the same object, or the same error, as in process.
        `background`: a model is decoding, and the parse steps aside for it (the module docstring)."""
        pool = self._started()
        if pool is None:  # the service is stopping: parse here, as a thread would
            return await asyncio.to_thread(parse_body, parse, raw)
        try:
            sent = await asyncio.wrap_future(pool.submit(sliced_parse_body, parse, raw, background))
        except BrokenProcessPool:  # the worker died (killed for memory?): a fresh one next time
            await asyncio.to_thread(self._broken, pool)
            return await asyncio.to_thread(parse_body, parse, raw)
        parsed: T = await asyncio.to_thread(sent.load)
        return parsed

    def close(self) -> None:
        """End the worker process and wait for it (idempotent; nothing to do if none was started)."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
