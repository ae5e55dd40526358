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
lists travel first, as slices pickled one after another into one stream by one pickler, and the object
last: loaded one pickle at a time on a thread, the lock passes to the threads that relay tokens between
two slices (1-2 ms each), and the object's own lists are then only references to what the slices
brought.

Why one pickler and one unpickler for all the pieces: what a parse returns holds each text of the body
twice (the decoded body, kept for idempotency and storage, and the items made from it, which are the
same `str` objects), and the pickle memo, shared by every piece of the stream, sends each object once:
9.0 MB for a 7.9 MiB body, as the worker held it, and the service's copy holds each text once too.
Nothing runs in Python per object on either side: with a `persistent_id` hook (which pickle calls for
every object) the worker took 279 ms to pickle that body's object, against 85 ms without.

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
import contextlib
import gc
import io
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields, is_dataclass
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
LIST_DEPTH = 3  # how deep in the object's fields and dicts long lists are looked for


def _long_lists(obj: Any, depth: int = LIST_DEPTH) -> list[Any]:
    """The lists and tuples of more than `CHUNK_ITEMS` items among `obj`'s fields, dict values and tuple
    items, `depth` levels down (a request's `items`, its body's `input`): a few attribute reads, never a
    walk of the items. Sequences of numbers are left whole: the memo does not keep numbers, so their
    slices would travel twice, and they unpickle at once anyway."""
    kind = type(obj)
    if (kind is list or kind is tuple) and len(obj) > CHUNK_ITEMS:
        return [] if type(obj[0]) in (int, float) else [obj]
    if depth == 0:
        return []
    if kind is dict:
        children: Any = obj.values()
    elif kind is tuple:
        children = obj
    elif is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in fields(obj)]
    else:
        return []
    return [found for child in children for found in _long_lists(child, depth - 1)]


@dataclass(frozen=True)
class Sliced:
    """A parsed body as it comes back: `slices` pickles of its long lists' slices, then the object, all
    in one stream with one memo (each object in it travels once)."""

    slices: int
    data: bytes

    def load(self) -> Any:
        """The object, read a pickle at a time: other threads may take the interpreter lock in between."""
        unpickler = pickle.Unpickler(io.BytesIO(self.data))
        for _ in range(self.slices):
            unpickler.load()  # Python between the pieces: the lock can pass to other threads here
        return unpickler.load()


def _sliced(parse: Callable[[Any], Any], raw: bytes) -> Sliced:
    with collector_paused():
        obj = parse_body(parse, raw)
        out = io.BytesIO()
        pickler = pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)
        slices = 0
        for long in _long_lists(obj):
            for i in range(0, len(long), CHUNK_ITEMS):
                pickler.dump(long[i : i + CHUNK_ITEMS])
                slices += 1
        pickler.dump(obj)  # its long lists' items are in the memo now: references only
    return Sliced(slices, out.getvalue())


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one parse in the worker, and back as it was after.

    A parse allocates about 10^5 containers (the decoded body, the validated items) that live until it
    ends, and at the collector's default thresholds it walks them again and again meanwhile: 50 of 222
    ms of the worker's CPU for an 8 MiB body (`benchmarks/loop_stall.py`'s). While a decode runs, that
    CPU comes out of the cycles the decode leaves, so the body's answer waits for it. The parse makes no
    cycles that outlive it; any it made are in the youngest generation when the collector is back, and
    its next pass finds them. The worker parses one body at a time and does nothing else, so no other
    work runs without a collector."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def sliced_parse_body(parse: Callable[[Any], Any], raw: bytes, background: bool = False) -> Sliced:
    """`parse_body` in the worker, its object pickled with long lists in slices, each object once
    (`Sliced.load` reads it back); with `background`, as work that steps aside (`priority.aside`)."""
    return aside(_sliced, parse, raw) if background else _sliced(parse, raw)


PIPE_BYTES = 2**20  # what a pipe to or from the worker holds (Linux; the most an unprivileged process may ask)


def _widen_pipes(pool: ProcessPoolExecutor) -> None:
    """Let the pipes that carry bodies to the worker and objects back hold `PIPE_BYTES` (Linux).

    A pipe holds 64 KiB by default, so 9 MB cross it in 140 reads, each of which allocates a buffer
    for all that remains: the service's reading thread took 17 ms of CPU per 9 MB read, 10 ms through
    a pipe of 1 MiB (in isolation; end to end it is within the noise of `loop_stall.py --cpu-only`).
    The pipes are the executor's own (`_call_queue`, `_result_queue`, not public): where they are not
    there, or not pipes, nothing changes but this speed."""
    try:
        import fcntl  # not on Windows

        setsize: int = fcntl.F_SETPIPE_SZ  # type: ignore[attr-defined,unused-ignore]  # Linux only
    except (ImportError, AttributeError):
        return
    ends = (
        getattr(getattr(pool, "_call_queue", None), "_writer", None),
        getattr(getattr(pool, "_result_queue", None), "_reader", None),
    )
    for end in ends:
        try:
            fcntl.fcntl(end.fileno(), setsize, PIPE_BYTES)  # type: ignore[union-attr]
        except (AttributeError, OSError):  # not a connection, or not a pipe, or over pipe-max-size
            pass


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
                _widen_pipes(self._pool)
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
