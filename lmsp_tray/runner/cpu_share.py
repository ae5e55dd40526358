"""Decode threads that make room for the rest of the desktop.

llama.cpp's CPU threads meet at a barrier after every operation of a decode, so a step is as slow as
its slowest thread. While other programs keep some of the machine's cores busy, one of the model's
threads is always waiting for a core, and every step waits for it: Gemma 3 270M on two cores decoded
40 tok/s with two threads and 24 with one on a quiet machine, and 12 with two but still 24 with one
beside a single busy process (`llama-server -t 2` / `-t 1`, the same build). A desktop is rarely
quiet: a browser tab, a build, an indexer.

`YieldingThreads` says how many threads the next decode should use: as many as the plan gives
(`most`, one per physical core), but no more than the logical CPUs that other programs left free over
the last half second (after a pause in decoding, the plan's count again until the next half second
has been read). Others' use is the machine's busy time (`/proc/stat`, steal included: a
hypervisor's other guests hold the core just as well) less this process's own (`os.times`, every
thread's, spinning included) and the service's that started it (relaying the tokens is part of the
work: counted as another program's, it took a thread from a stream on a quiet two-core machine). The
count is rounded, so a background program using a third of a core does not cost a thread, and one
that wants a whole core does.

Linux only (where `/proc/stat` is); elsewhere the plan's count stays, as before. A `threads` number
set for the model is the person's choice and is kept as given (see `runner/model.py`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

INTERVAL_S = 0.5  # how often the machine's use is read (and the thread count may change)
STALE_INTERVALS = 3  # a longer window (no decode in it) is not measured but restarted
PROC_STAT = "/proc/stat"


@dataclass(frozen=True)
class CpuSeconds:
    """The machine's busy CPU time (all CPUs) and this process's own with its parent's (the service), in seconds."""

    machine: float
    own: float


def read_cpu_seconds(path: str = PROC_STAT) -> CpuSeconds | None:
    """Now's `CpuSeconds`, or None where the machine's figures cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    own = os.times()
    parent = _process_ticks(os.getppid(), path)
    return CpuSeconds((user + nice + system + irq + softirq + steal) / ticks, own.user + own.system + parent / ticks)


def _process_ticks(pid: int, proc_stat: str) -> int:
    """A process's user and system time in clock ticks (0 where it cannot be read)."""
    try:
        with open(os.path.join(os.path.dirname(proc_stat), str(pid), "stat"), encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def logical_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_for(others: float, cpus: int, most: int) -> int:
    """Threads to use when other programs use `others` of the `cpus` CPUs: the free ones, rounded, 1 to `most`."""
    return max(1, min(most, int(cpus - others + 0.5)))


class YieldingThreads:
    """The thread count for the next decode (see the module); call `threads()` before each one."""

    def __init__(
        self,
        most: int,
        *,
        read: Callable[[], CpuSeconds | None] = read_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
        interval: float = INTERVAL_S,
    ) -> None:
        self.most = max(1, most)
        self._read = read
        self._clock = clock
        self._cpus = cpus or logical_cpus()
        self._interval = interval
        self._current = self.most
        self._since = clock()
        self._last = read()
        self.others = 0.0  # CPUs' worth of other programs' use over the last interval (observable)

    def threads(self) -> int:
        now = self._clock()
        if self._last is None or now - self._since < self._interval:
            return self._current
        sample = self._read()
        if sample is None:
            return self._current
        wall = now - self._since
        if wall > STALE_INTERVALS * self._interval:
            # The model was idle: that window says what the desktop did before this request (a build
            # since ended, say). Start from the plan again and read the next interval.
            self._last, self._since, self._current = sample, now, self.most
            return self._current
        self.others = max(0.0, (sample.machine - self._last.machine) - (sample.own - self._last.own)) / wall
        self._last, self._since = sample, now
        self._current = threads_for(self.others, self._cpus, self.most)
        return self._current
