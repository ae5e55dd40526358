"""A model's waiting line: who may queue, and when to come back.

Each loaded model decodes `parallel` sequences at once and lets `max_queue`
more requests wait; one more gets `429 too_many_requests` with a
`Retry-After` estimated from how long recent requests took. A model being
unloaded answers `503`. `Admission` keeps that count for a model running in
another process (`process.ModelProcess` answers at once, no round trip);
the scheduler applies the same rule to its own queue with `retry_after`.
"""

from __future__ import annotations

import collections
import math
import threading

from lmsp_tray.errors import ServiceUnavailable, TooManyRequests


def retry_after(durations: collections.deque[float], waiting: int, slots: int) -> int:
    """Seconds until a slot is likely free: the median recent request time per wave of `slots`."""
    typical = sorted(durations)[len(durations) // 2] if durations else 2.0
    return max(1, min(60, math.ceil(typical * (waiting + 1) / max(1, slots))))


def too_many(waiting: int, durations: collections.deque[float], slots: int) -> TooManyRequests:
    return TooManyRequests(
        f"{waiting} requests are already waiting for this model; try again shortly.",
        headers={"Retry-After": str(retry_after(durations, waiting, slots))},
    )


def unloading() -> ServiceUnavailable:
    return ServiceUnavailable("The model is being unloaded; send the request again to load it anew.")


class Admission:
    """Outstanding requests of one model (generating or waiting), thread-safe."""

    def __init__(self, parallel: int, max_queue: int) -> None:
        self.parallel = parallel
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._outstanding = 0
        self._closed = False
        self._durations: collections.deque[float] = collections.deque(maxlen=16)

    @property
    def outstanding(self) -> int:
        with self._lock:
            return self._outstanding

    def admit(self) -> None:
        """Count one more request, or raise 503 (closed) / 429 (the waiting line is full)."""
        with self._lock:
            if self._closed:
                raise unloading()
            waiting = self._outstanding - self.parallel
            if waiting >= self.max_queue:
                raise too_many(waiting, self._durations, self.parallel)
            self._outstanding += 1

    def done(self, seconds: float | None = None) -> None:
        """A request ended; `seconds` (submit to finish) feeds the Retry-After estimate."""
        with self._lock:
            self._outstanding = max(0, self._outstanding - 1)
            if seconds is not None:
                self._durations.append(seconds)

    def close(self) -> None:
        with self._lock:
            self._closed = True
