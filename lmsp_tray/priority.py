"""Work that steps aside for the decode: the lowest CPU priority for a thread, and what earns it.

Why a module: on a small machine a stream's decode keeps every core busy, and whatever else runs at its
priority takes cycles from it, so a stream's tokens stall. The service's parse of a big request body (a
worker process, `http.body_parser`) and the model process's writes of its prompt cache
(`runner.prompt_cache`) can wait instead; they step aside the same way, here.

Why not the model process's tokenizing of a big text (what `serving.input_bounds.token_floor` sends of a
prompt far over the window) as well: tried, on a thread in the idle scheduling class, and the streams'
longest gaps with 8 MiB bodies arriving grew (0.61-0.70 s to 0.78-1.50 s, three rounds of
`benchmarks/loop_stall.py` each, quiet 2-core machine): the tokenizing holds the interpreter lock between
its calls into llama.cpp, and a thread of the lowest priority that is preempted holding it stops the
decode's own thread. A thread of its own priority is for work that releases the lock (a process's only
thread, or file writes).

Why the decode must run in the same scheduling group as what steps aside: Linux shares the CPU between
groups (a session each, autogroup) before it weighs threads, so the idle class yields only to threads of
its own group. The model process therefore stays in the service's session (`engine.process`); in a
session of its own it lost 0.36-0.40 of two cores to the idle-class parse of the body worker.

Why only while there is a decode to step aside for (`aside`, chosen per piece of work): the idle class
steps aside for every other program too. Beside two busy programs (a compile) on a 2-core machine, 50 ms
of work took 7.8-8.5 s in the idle class and 0.17 s at normal priority; a coding agent's 300 KiB turn,
parsed in the idle class while nothing decodes, would wait seconds behind the user's build.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

THREADS_HAVE_PRIORITY = sys.platform.startswith("linux")  # each thread has its own niceness and class
BACKGROUND_INPUT_BYTES = 256 * 1024  # a request body this long or longer is parsed as background work
BACKGROUND_NICE = 19  # the lowest priority


def lower_thread(nice: int) -> None:
    """The calling thread's niceness (Linux, where each thread has its own; elsewhere nothing)."""
    if THREADS_HAVE_PRIORITY:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def step_aside(*, whole_process: bool = False) -> None:
    """The calling thread at the lowest priority: nice 19 and, on Linux, the idle scheduling class, where a
    decode thread that wakes takes its core at once and a core running only this counts as free (at nice 19
    alone it would still share a core by weight). Where threads have no priority of their own (macOS,
    Windows) only a process that does nothing else steps aside (`whole_process`: the body worker); a
    thread of the model process there keeps the decode's priority."""
    if THREADS_HAVE_PRIORITY:
        lower_thread(BACKGROUND_NICE)
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif whole_process and hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(BACKGROUND_NICE)


def start_worker() -> None:
    """A worker process's start (the body worker's): where threads have no priority of their own, the whole
    process steps aside now, for good; on Linux each piece of work chooses (`aside`)."""
    if not THREADS_HAVE_PRIORITY:
        step_aside(whole_process=True)


def aside(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` as work that steps aside: on Linux on a thread of its own that steps aside and ends with
    the work, so the caller's thread keeps its class (an unprivileged thread cannot leave the idle class
    again, and at nice 19 it would get about 1.5% of a core beside any other busy program); elsewhere in
    the caller's thread, whose process stepped aside at its start (`start_worker`). Returns what `fn`
    returns, or raises what it raised."""
    if not THREADS_HAVE_PRIORITY:
        return fn(*args)
    with ThreadPoolExecutor(1, thread_name_prefix="lmsp-aside", initializer=step_aside) as thread:
        return thread.submit(fn, *args).result()
