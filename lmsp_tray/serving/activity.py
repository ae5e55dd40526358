"""What the service has been doing lately: recent requests, a tokens/s and memory series, the log.

Why: the console's Activity view shows a live table of requests (time, app,
model, endpoint, tokens in/out, time to first token, tokens/s, status), a
small chart of throughput and memory over the last minutes, and the service
log. Nothing of it is kept on disk; everything lives in bounded ring buffers
here, read through ``GET /lmsp/v1/activity``.

- `ActivityLog.begin` is called by the HTTP layer for each request and sets
  the request's entry in a context variable; a response started while
  handling that request inherits the context, so `run_finished` (a
  `Service` run listener) adds the model's figures to the same row. Runs
  with no request (tasks resumed after a restart) get a row of their own.
- `ActivityLog.sample` appends one point to the series; `Sampler` calls it
  every `interval` seconds on a thread of its own.
- `LogBuffer` is a logging handler keeping the last lines, with anything
  shaped like a token, code or bearer credential replaced before it is kept.

Every entry carries `seq`, the value of a counter bumped on each change, so
a reader polls with ``after=<largest seq seen>`` and gets only what changed.

Beside the recent rows, `Totals` keeps the running sums since start that the
rows are counted into as they end (requests by model, route and status;
prompt, cached and generated tokens; time to first token and between tokens
as histograms). ``GET /lmsp/v1/activity`` shows them as `totals` and
``GET /metrics`` renders the same objects for Prometheus: one bookkeeping.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmsp_tray.serving.service import ResponseRun, Service

MAX_REQUESTS = 500
MAX_LOG_LINES = 500
MAX_POINTS = 300  # 10 minutes at one point every 2 s
SAMPLE_INTERVAL_S = 2.0
STOPPED = "stopped"  # the outcome of an answer whose reader left before its end (the person stopped it)
# Below this, the text of a short answer reaches the event loop in one burst and a rate means nothing.
MIN_DECODE_S = 0.05

# Token secrets (lmsp_), pairing poll tokens (lmspp_), console codes (lmspc_), bearer credentials.
_SECRET = re.compile(r"lmsp[pc]?_[A-Za-z0-9_\-]{8,}|(?i:bearer)\s+[A-Za-z0-9._~+/=\-]{8,}")


def redact(text: str) -> str:
    """`text` with every secret-shaped string replaced by ``[redacted]``."""
    return _SECRET.sub("[redacted]", text)


@dataclass
class RequestEntry:
    """One row of the activity table (mutable while its request runs; read under the log's lock)."""

    id: int
    seq: int
    started_at: float  # wall clock
    method: str
    endpoint: str
    app: str | None  # the token's name; None for public endpoints
    started: float = field(default_factory=time.monotonic, repr=False)
    status: int | None = None  # HTTP status once known
    duration_ms: float | None = None
    model: str | None = None
    outcome: str | None = None  # completed | incomplete | cancelled | failed | stopped (responses only)
    tokens_in: int | None = None
    tokens_out: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    done: bool = False
    route: str | None = field(default=None, repr=False)  # the route's path pattern (the totals' label)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "seq": self.seq,
            "time": round(self.started_at, 3),
            "method": self.method,
            "endpoint": self.endpoint,
            "app": self.app,
            "status": self.status,
            "duration_ms": _round(self.duration_ms),
            "model": self.model,
            "outcome": self.outcome,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cached_tokens": self.cached_tokens,
            "ttft_ms": _round(self.ttft_ms),
            "tokens_per_s": _round(self.tokens_per_s),
            "done": self.done,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass(frozen=True)
class RunFigures:
    """What a finished response reports (see `Service.add_run_listener`)."""

    model: str
    outcome: str
    tokens_in: int
    tokens_out: int
    cached_tokens: int
    created: float  # monotonic, when the run was created
    first_output: float | None  # monotonic, first text out
    finished: float  # monotonic


# Histogram bounds, in seconds (Prometheus's `le`; +Inf is implied).
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INTER_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Histogram:
    """Cumulative counts per upper bound, with the count and sum of what was observed."""

    bounds: tuple[float, ...]
    buckets: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0

    def __post_init__(self) -> None:
        self.buckets = self.buckets or [0] * len(self.bounds)

    def observe(self, value: float, times: int = 1) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += times
        self.count += times
        self.sum += value * times

    def to_json(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "buckets": list(self.buckets), "count": self.count, "sum": self.sum}


@dataclass
class ModelTotals:
    """One model's figures since start, from its finished responses."""

    responses: dict[str, int] = field(default_factory=dict)  # by outcome
    prompt_tokens: int = 0  # evaluated (not taken from the cache)
    cached_tokens: int = 0  # prompt tokens reused from the KV cache
    generated_tokens: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_BUCKETS))

    def to_json(self) -> dict[str, Any]:
        return {
            "responses": dict(self.responses),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_seconds": self.ttft.to_json(),
            "inter_token_seconds": self.inter_token.to_json(),
        }


@dataclass
class Totals:
    """Running sums since the service started (a copy, read under the log's lock)."""

    requests: dict[tuple[str, str, str, str], int] = field(default_factory=dict)  # (model, method, route, status)
    models: dict[str, ModelTotals] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": [
                {"model": m, "method": meth, "route": r, "status": st, "count": n}
                for (m, meth, r, st), n in sorted(self.requests.items())
            ],
            "models": {name: figures.to_json() for name, figures in sorted(self.models.items())},
        }


@dataclass(frozen=True)
class Point:
    time: float
    tokens_per_s: float
    rss_bytes: int | None
    models_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "time": round(self.time, 3),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "rss_bytes": self.rss_bytes,
            "models_bytes": self.models_bytes,
        }


@dataclass(frozen=True)
class LogLine:
    seq: int
    time: float
    level: str
    logger: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": round(self.time, 3),
            "level": self.level,
            "logger": self.logger,
            "message": self.message,
        }


class ActivityLog:
    """Bounded, thread-safe record of recent requests, the series and the log lines."""

    def __init__(
        self,
        *,
        output_tokens: Callable[[], int] = lambda: 0,
        models_bytes: Callable[[], int] = lambda: 0,
        rss_bytes: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._output_tokens = output_tokens
        self._models_bytes = models_bytes
        self._rss_bytes = rss_bytes or process_rss
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self._ids = 0
        self._requests: deque[RequestEntry] = deque(maxlen=MAX_REQUESTS)
        self._lines: deque[LogLine] = deque(maxlen=MAX_LOG_LINES)
        self._points: deque[Point] = deque(maxlen=MAX_POINTS)
        self._last_sample: tuple[float, int] | None = None  # (monotonic, output tokens so far)
        self._totals = Totals()
        # One per log (not per module), so two daemons in one process never mix their rows.
        self._current: contextvars.ContextVar[RequestEntry | None] = contextvars.ContextVar(
            f"lmsp_activity_{id(self)}", default=None
        )

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- requests (called by the HTTP layer and the service) --------------------------------------
    def begin(self, method: str, endpoint: str, app: str | None) -> tuple[RequestEntry, contextvars.Token]:
        """A new row for a request now starting; it is the current row until `reset(token)`."""
        with self._lock:
            self._ids += 1
            entry = RequestEntry(self._ids, self._next_seq(), self._clock(), method, redact(endpoint), app)
            self._requests.append(entry)
        return entry, self._current.set(entry)

    def reset(self, token: contextvars.Token) -> None:
        self._current.reset(token)

    def end(self, entry: RequestEntry, status: int | None, route: str | None = None) -> None:
        """The request's answer is complete (its last byte sent, or the client left); `route`: the
        path pattern it matched (what the totals count it under; the path itself when None)."""
        with self._lock:
            if entry.done:
                return
            entry.status = status if entry.status is None else entry.status
            entry.duration_ms = (time.monotonic() - entry.started) * 1000
            entry.done = True
            entry.seq = self._next_seq()
            # A refused request's model is only what its path said (any string): not a label of its own.
            known = entry.outcome is not None or (entry.status or 0) < 400
            key = (entry.model or "" if known else "", entry.method, route or entry.endpoint, str(entry.status or 0))
            self._totals.requests[key] = self._totals.requests.get(key, 0) + 1

    def status(self, entry: RequestEntry, status: int, app: str | None = None) -> None:
        """The status line went out (a stream's status is known long before it ends); `app`: who asked."""
        with self._lock:
            entry.status = status
            entry.app = app
            entry.seq = self._next_seq()

    def run_finished(self, figures: RunFigures) -> None:
        """A response ended: its figures go on the current request's row, or a row of its own."""
        entry = self._current.get()
        if entry is None:
            entry, token = self.begin("RUN", "(task)", None)
            self.reset(token)
            with self._lock:
                entry.started = figures.created
                entry.done = True
        with self._lock:
            entry.model = figures.model
            entry.outcome = figures.outcome
            entry.tokens_in = figures.tokens_in
            entry.tokens_out = figures.tokens_out
            entry.cached_tokens = figures.cached_tokens
            totals = self._totals.models.setdefault(figures.model, ModelTotals())
            totals.responses[figures.outcome] = totals.responses.get(figures.outcome, 0) + 1
            totals.prompt_tokens += max(0, figures.tokens_in - figures.cached_tokens)
            totals.cached_tokens += figures.cached_tokens
            totals.generated_tokens += figures.tokens_out
            if figures.first_output is not None:
                entry.ttft_ms = (figures.first_output - entry.started) * 1000
                totals.ttft.observe(max(0.0, figures.first_output - entry.started))
                decoding = figures.finished - figures.first_output
                if figures.tokens_out > 1 and decoding >= MIN_DECODE_S:
                    entry.tokens_per_s = (figures.tokens_out - 1) / decoding
                if figures.tokens_out > 1:  # each gap between two tokens, at the response's mean gap
                    totals.inter_token.observe(max(0.0, decoding) / (figures.tokens_out - 1), figures.tokens_out - 1)
            entry.seq = self._next_seq()

    def note_model(self, model: str) -> None:
        """The current request is about `model` (load, unload, get)."""
        entry = self._current.get()
        if entry is not None:
            with self._lock:
                entry.model = model
                entry.seq = self._next_seq()

    # -- series ------------------------------------------------------------------------------------
    def sample(self) -> Point:
        """Append one point: output tokens per second since the last point, process and model memory."""
        now = time.monotonic()
        total = self._output_tokens()
        rate = 0.0
        if self._last_sample is not None:
            then, before = self._last_sample
            if now > then:
                rate = max(0, total - before) / (now - then)
        self._last_sample = (now, total)
        point = Point(self._clock(), rate, self._rss_bytes(), self._models_bytes())
        with self._lock:
            self._points.append(point)
        return point

    # -- log -----------------------------------------------------------------------------------------
    def log_line(self, when: float, level: str, logger: str, message: str) -> None:
        with self._lock:
            self._lines.append(LogLine(self._next_seq(), when, level, logger, redact(message)))

    # -- reading -----------------------------------------------------------------------------------
    def totals(self) -> Totals:
        """A copy of the running sums since start."""
        with self._lock:
            return copy.deepcopy(self._totals)

    def snapshot(self, after: int = 0) -> dict[str, Any]:
        """Rows and log lines changed after `after` (all with 0), the whole series, and the new cursor."""
        with self._lock:
            requests = [e.to_json() for e in self._requests if e.seq > after]
            lines = [ln.to_json() for ln in self._lines if ln.seq > after]
            points = [p.to_json() for p in self._points]
            cursor = self._seq
            totals = self._totals.to_json()
        return {
            "object": "activity",
            "cursor": cursor,
            "requests": requests,
            "log": lines,
            "series": points,
            "sample_interval_s": SAMPLE_INTERVAL_S,
            "totals": totals,
        }


class LogBuffer(logging.Handler):
    """Keeps the service's log lines in an `ActivityLog` (secrets redacted there)."""

    def __init__(self, activity: ActivityLog, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.activity = activity

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                message = f"{message} ({type(exc).__name__}: {exc})"  # no traceback: it is a user's view
            self.activity.log_line(record.created, record.levelname, record.name, message)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


class Sampler:
    """Calls `activity.sample()` every `interval` seconds on a thread of its own."""

    def __init__(self, activity: ActivityLog, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.activity = activity
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="lmsp-activity", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.activity.sample()
            except Exception:
                logging.getLogger("lmsp_tray.serving.activity").debug("sample failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def process_rss() -> int | None:
    """This process's resident memory in bytes (Linux: /proc; elsewhere None)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def watch_service(activity: ActivityLog, service: Service) -> None:
    """Feed `activity` with the figures of every response `service` finishes."""

    def finished(run: ResponseRun) -> None:
        finish = run.finish
        # No finish: its reader went away first (the person pressed Stop, the app closed the stream);
        # generation was stopped then, after the prompt and the tokens streamed so far.
        outcome = run.assembler.status if finish is not None or run.assembler.finished else STOPPED
        activity.run_finished(
            RunFigures(
                model=run.assembler.model,
                outcome=outcome,
                tokens_in=finish.prompt_tokens if finish else len(run.job.prompt),
                tokens_out=finish.output_tokens if finish else run.pieces,
                cached_tokens=finish.cached_tokens if finish else 0,
                created=run.created,
                first_output=run.first_output,
                finished=time.monotonic(),
            )
        )

    service.add_run_listener(finished)
