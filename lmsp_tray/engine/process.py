"""The service's side of a model process: a `LoadedModel` whose llama.cpp runs elsewhere.

`ModelProcess` starts the model process (`runner.worker`, by its module name:
`launch`) for one model, sends it the load plan, and then
stands in for the model: jobs go out as `wire.SUBMIT` frames and their
deltas come back on a reader thread, which hands each to the job's sink (as
the scheduler thread does in-process). Template rendering stays here (pure
Python, bounded: `templates`); tokenization goes to the model process, so
this process never runs llama.cpp on a model's data. The waiting line is
counted here, so `429` and `503` are answered at once without a round trip.
Writes go through one writer thread, so the event loop never waits on the pipe.

When the process dies — SIGBUS from a model file changed under it, a
llama.cpp abort, the out-of-memory killer — the reader sees the pipe close:
every job of this model ends with `model_crashed` saying what happened (from
the exit signal and llama.cpp's last words on stderr), pending calls fail
with it, and `on_exit` tells the model manager, which marks the model
`error` and loads it again on the next request. Nothing else is touched.

Why the model process has a process group of its own but stays in the
service's session (`process_group=0`, not a new session): a terminal's
Ctrl+C goes to the service's process group only (the service decides when a
model ends), and on Linux the process stays in the service's scheduling
group. Linux gives each session a group of its own (autogroup) and shares
the CPU between groups before threads: the service's work that steps aside
for the decode (`priority.aside`, the body worker's parse) yields only to
threads of its own group. With the model process in a session of its own,
the idle-class parse of 8 MiB bodies took 0.36-0.40 of two cores from a
4-stream decode (the model process had 1.33 cores instead of 1.8, and the
streams' longest gaps grew from 0.42 to 0.72-0.86 s, median of six
decodes: `benchmarks/loop_stall.py`); in the service's session it takes
0.04-0.05 and the decode keeps 1.73-1.76 cores.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine import allocator, embedding, launch, wire
from lmsp_tray.engine.admission import Admission, unloading
from lmsp_tray.engine.embedding import EmbedCancel, Embeddings
from lmsp_tray.engine.jobs import ERROR, AudioClip, Finish, GenerationJob, GrammarOn, ImagePixels
from lmsp_tray.engine.load_plan import LoadOptions, LoadPlan, without_draft, without_projector
from lmsp_tray.engine.loaded import ModelStats, Placement
from lmsp_tray.engine.templates import ChatTemplate
from lmsp_tray.engine.trigger import CallMarkers
from lmsp_tray.errors import LMSPError, ModelCrashed, ModelLoadFailed, ServiceUnavailable

log = logging.getLogger("lmsp_tray.engine.process")
worker_log = logging.getLogger("lmsp_tray.runner.worker")

CLOSE_GRACE_S = 10.0  # a model process asked to stop without draining gets this long before SIGKILL
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}

ExitListener = Callable[["ModelProcess", LMSPError], None]


class RemoteScheduler:
    """The model process's scheduler counters, read on demand (tests, diagnostics)."""

    def __init__(self, model: ModelProcess) -> None:
        self._model = model

    @property
    def steps(self) -> int:
        return self._model.stats().steps

    @property
    def queued(self) -> int:
        return self._model.stats().queued

    @property
    def generating(self) -> int:
        return self._model.stats().generating

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self._model.stats(batches=True).batch_sizes

    @property
    def busy(self) -> bool:
        return self._model.busy


class ModelProcess:
    """A model loaded in a process of its own (see the module docstring)."""

    def __init__(
        self,
        entry: ModelEntry,
        options: LoadOptions,
        plan: LoadPlan,
        *,
        on_exit: ExitListener | None = None,
        on_progress: Callable[[float], None] | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.id = entry.id
        self.entry = entry
        self.options = options
        self.plan = plan
        self.scheduler = RemoteScheduler(self)
        self._on_exit = on_exit
        self._on_progress = on_progress
        self._lock = threading.Lock()
        self._jobs: dict[int, GenerationJob] = {}
        self._calls: dict[int, concurrent.futures.Future[tuple[int, bytes]]] = {}
        self._ids = itertools.count(1)
        self._closing = False
        self._exited = threading.Event()
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self._last_activity = time.monotonic()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._token_ids: dict[str, int | None] = {}
        self._control: dict[int, bool] = {}
        self._longest_piece: int | None = None  # asked once, at the first long conversation
        self._embedding = 0  # embedding requests in flight
        self.exit_error: LMSPError | None = None
        started = time.monotonic()
        env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONUNBUFFERED="1")
        preload = allocator.find(options.allocator)
        if preload is not None:
            env.update(preload.environment(env))
        self.allocator = preload.name if preload is not None else "system"
        try:
            self._proc = subprocess.Popen(
                list(command or launch.worker_command()),
                cwd=launch.home(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                bufsize=0,
                close_fds=True,
                process_group=None if sys.platform == "win32" else 0,  # its own group, our session: see above
            )
        except OSError as exc:
            raise ModelLoadFailed(f"Could not start a process for '{entry.id}': {exc}") from None
        assert self._proc.stdin is not None and self._proc.stdout is not None and self._proc.stderr is not None
        self.pid = self._proc.pid
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer = wire.FrameWriter(self._proc.stdin.fileno())
        self._threads = [
            threading.Thread(target=self._write_loop, name=f"lmsp-proc-out-{entry.id}", daemon=True),
            threading.Thread(target=self._read_loop, name=f"lmsp-proc-in-{entry.id}", daemon=True),
            threading.Thread(target=self._stderr_loop, name=f"lmsp-proc-err-{entry.id}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self._send(wire.frame(wire.LOAD, 0, wire.pack_json(launch.load_spec(entry, options, plan, _log_level()))))
        try:
            facts = self._ready.result()
        except LMSPError:
            self._reap()
            raise
        self.loaded_at = time.time()
        self.load_seconds = time.monotonic() - started
        try:
            self.context_length = int(facts["context_length"])
            self.parallel = int(facts["parallel"])
            self._admission = Admission(self.parallel, options.max_queue)
            self.placement = Placement(**facts["placement"])
            # The GPU layers it runs with: fewer than planned when the GPU ran out of memory at load.
            self.plan = dataclasses.replace(plan, gpu_layers=self.placement.gpu_layers)
            skipped = facts.get("projector_skipped")
            if skipped and not plan.projector_skipped:  # libmtmd did not load the projector: text only
                self.plan = without_projector(self.plan, str(skipped))
            draft_skipped = facts.get("draft_skipped")
            if draft_skipped and not plan.draft_skipped:  # the model process refused the draft (its vocabulary)
                self.plan = without_draft(self.plan, str(draft_skipped))
            t = facts["template"]
            self.template = ChatTemplate(t["source"], t["name"], t["bos_token"], t["eos_token"], model_id=entry.id)
            self.embeddings = bool(facts.get("embeddings"))
            self.sliding_window = bool(facts.get("sliding_window"))
        except (KeyError, TypeError, ValueError) as exc:
            self.close()
            raise ModelLoadFailed(f"Could not load '{entry.id}': the model process answered oddly ({exc}).") from None
        log.info(
            "%s runs in process %d (loaded in %.2fs, %s malloc)", self.id, self.pid, self.load_seconds, self.allocator
        )

    # -- LoadedModel ----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._jobs) or self._embedding > 0

    @property
    def last_activity(self) -> float:
        return self._last_activity

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    def render(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> str:
        return self.template.render(messages, **kwargs)

    def find_token(self, text: str) -> int | None:
        if text not in self._token_ids:
            self._token_ids[text] = wire.unpack_json(self._call({"op": "find_token", "text": text}))
        return self._token_ids[text]

    def is_control(self, token: int) -> bool:
        if token not in self._control:
            self._control[token] = bool(wire.unpack_json(self._call({"op": "is_control", "token": token})))
        return self._control[token]

    def tokenize_prompt(self, text: str, *, at_most: int | None = None) -> list[int]:
        head = struct.pack("<I", at_most or 0)
        _, payload = self._request(wire.TOKENIZE, head + text.encode("utf-8", errors="replace"))
        return wire.unpack_tokens(payload)

    def longest_piece(self) -> int:
        if self._longest_piece is None:
            self._longest_piece = int(wire.unpack_json(self._call({"op": "longest_piece"})))
        return self._longest_piece

    def measure(self, prompt: Sequence[int], media: Sequence[ImagePixels | AudioClip]) -> int:
        _, payload = self._request(wire.MEASURE, wire.pack_job({}, prompt, media))
        return wire.unpack_tokens(payload)[0]

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True, with_pieces: bool = False
    ) -> list[Any]:
        """The tokens of `text` as the model process's tokenizer gives them (with `with_pieces`, each as
        `{"id", "piece"}`), for `/tokenize`; nothing is decoded."""
        request = {"op": "tokenize", "text": text, "add_special": add_special, "parse_special": parse_special}
        return list(wire.unpack_json(self._call({**request, "with_pieces": with_pieces})))

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`, special tokens written out."""
        return str(wire.unpack_json(self._call({"op": "detokenize", "tokens": [int(t) for t in tokens]})))

    def fim_tokens(self, prefix: str, suffix: str) -> list[int]:
        return list(wire.unpack_json(self._call({"op": "fim_tokens", "prefix": prefix, "suffix": suffix})))

    def stats(self, *, batches: bool = False) -> ModelStats:
        data = wire.unpack_json(self._call({"op": "stats", "batches": batches}))
        data["batch_sizes"] = tuple(data.get("batch_sizes") or ())
        return ModelStats(**data)

    def submit(self, job: GenerationJob) -> None:
        trigger = job.grammar_trigger
        if trigger is not None and not isinstance(trigger, CallMarkers):
            raise TypeError("a model process runs lazy grammars given as CallMarkers only")
        with self._lock:
            if self._closing or self._exited.is_set():
                raise unloading()
            self._admission.admit()  # 429 when the waiting line is full
            ident = next(self._ids)
            self._jobs[ident] = job
            self._last_activity = time.monotonic()
        spec = {
            "sampling": wire.sampling_to_json(job.sampling),
            "max_tokens": job.max_tokens,
            "stop": list(job.stop),
            "stop_tokens": sorted(job.stop_tokens),
            "visible_tokens": sorted(job.visible_tokens),
            "lazy": trigger.to_json() if trigger is not None else None,
            "logprobs": job.logprobs,
            "stable_prefix": job.stable_prefix,
        }
        cancel = wire.frame(wire.CANCEL, ident)
        job.on_cancel = lambda: self._send(cancel)
        self._send(wire.frame(wire.SUBMIT, ident, wire.pack_job(spec, job.prompt, job.images)))
        if job.cancelled:  # cancelled before the hook was in place
            self._send(cancel)

    def embed(self, inputs: Sequence[str | Sequence[int]], *, cancel: EmbedCancel | None = None) -> Embeddings:
        """One vector per input, computed in the model process (blocking); `cancel` sends it a CANCEL
        for the request, and the answer is then `RequestCancelled`."""
        return self._embed({"inputs": list(inputs)}, cancel)

    def rerank(self, pairs: Sequence[tuple[str, str]], *, cancel: EmbedCancel | None = None) -> Embeddings:
        """A reranker's scores (row i, column 0) of (query, document) pairs, as `embed` computes vectors."""
        return self._embed({"pairs": [list(pair) for pair in pairs]}, cancel)

    def _embed(self, request: dict[str, Any], cancel: EmbedCancel | None) -> Embeddings:
        with self._lock:
            if self._closing or self._exited.is_set():
                raise unloading()
            self._embedding += 1
            self._last_activity = time.monotonic()
        try:
            _, payload = self._request(wire.EMBED, wire.pack_json(request), cancel=cancel)
            return embedding.unpack(payload)
        finally:
            with self._lock:
                self._embedding -= 1
                self._last_activity = time.monotonic()

    def close(self, *, drain: bool = False) -> None:
        """Stop the process (letting running and queued jobs finish with `drain`) and wait for it."""
        with self._lock:
            first = not self._closing
            self._closing = True
        if first and not self._exited.is_set():
            self._send(wire.frame(wire.CLOSE, 0, b"1" if drain else b"0"))
        if not drain and not self._exited.wait(CLOSE_GRACE_S):
            log.warning("%s: the model process did not stop in %.0fs; killing it", self.id, CLOSE_GRACE_S)
            self._kill()
        self._exited.wait()
        self._reap()

    def kill(self) -> None:
        """End the process at once (its jobs end as after a crash)."""
        self._kill()

    # -- the pipe -------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        self._outbox.put(data)

    def _write_loop(self) -> None:
        while (data := self._outbox.get()) is not None:
            parts = [data]
            with_more = True
            while with_more:
                try:
                    more = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    with_more = False
                    self._outbox.put(None)
                    break
                parts.append(more)
            self._writer.send(b"".join(parts))

    def _request(self, kind: int, payload: bytes, *, cancel: EmbedCancel | None = None) -> tuple[int, bytes]:
        future: concurrent.futures.Future[tuple[int, bytes]] = concurrent.futures.Future()
        with self._lock:
            if self._exited.is_set():
                raise self.exit_error or ServiceUnavailable("The model is not running.")
            ident = next(self._ids)
            self._calls[ident] = future
        self._send(wire.frame(kind, ident, payload))
        if cancel is not None:  # after the request: the process meets the CANCEL behind it
            cancel.bind(functools.partial(self._send, wire.frame(wire.CANCEL, ident)))
        kind, answer = future.result()
        if kind == wire.ERROR:
            raise wire.unpack_error(wire.unpack_json(answer))
        return kind, answer

    def _call(self, request: dict[str, Any]) -> bytes:
        return self._request(wire.CALL, wire.pack_json(request))[1]

    def _read_loop(self) -> None:
        assert self._proc.stdout is not None
        try:
            for kind, ident, payload in wire.FrameReader(self._proc.stdout.fileno()).frames():
                self._dispatch(kind, ident, payload)
        except Exception:
            log.exception("%s: unreadable output from the model process", self.id)
            self._kill()
        self._ended()

    def _dispatch(self, kind: int, ident: int, payload: bytes) -> None:
        if kind == wire.TEXT or kind == wire.GRAMMAR_ON:
            with self._lock:
                job = self._jobs.get(ident)
            if job is not None:
                if job.first_token_at is None:
                    job.first_token_at = time.monotonic()
                text = payload.decode("utf-8", errors="replace")
                job.sink(text if kind == wire.TEXT else GrammarOn(text))
        elif kind == wire.LOGPROB:
            with self._lock:
                job = self._jobs.get(ident)
            if job is not None:
                job.sink(wire.unpack_logprob(payload))
        elif kind == wire.FINISH:
            now = time.monotonic()
            with self._lock:
                job = self._jobs.pop(ident, None)
                self._last_activity = now
            if job is not None:
                self._admission.done(now - job.submitted_at)
                job.sink(wire.unpack_finish(payload))
        elif kind in (wire.REPLY, wire.TOKENS, wire.ERROR, wire.EMBEDDINGS):
            with self._lock:
                future = self._calls.pop(ident, None)
            if future is not None:
                future.set_result((kind, payload))
        elif kind == wire.LOADING:
            if self._on_progress is not None:
                try:
                    self._on_progress(wire.LOAD_PROGRESS.unpack(payload)[0])
                except Exception:  # a failing listener must not stop the reader
                    log.exception("%s: load progress listener failed", self.id)
        elif kind == wire.READY:
            self._ready.set_result(wire.unpack_json(payload))
        elif kind == wire.FAILED:
            self._ready.set_exception(wire.unpack_error(wire.unpack_json(payload)))

    def _stderr_loop(self) -> None:
        assert self._proc.stderr is not None
        for raw in iter(self._proc.stderr.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip()
            if not line:
                continue
            self._stderr_tail.append(line)
            level_name, _, rest = line.partition(" ")
            level = _LEVELS.get(level_name)
            if level is not None:
                worker_log.log(level, "%s: %s", self.id, rest)
            else:  # C code writing to stderr (llama.cpp's asserts among them)
                worker_log.warning("%s: %s", self.id, line)

    def _ended(self) -> None:
        """The process's output closed: it exited. End whatever it still had."""
        rc = self._proc.wait()
        for thread in self._threads[2:]:
            thread.join(2.0)  # its last words on stderr
        loaded = self._ready.done() and self._ready.exception() is None
        if not self._ready.done():
            error: LMSPError = ModelLoadFailed(f"Could not load '{self.id}': {self._reason(rc)}.")
        elif not loaded:
            error = ServiceUnavailable("The model did not load.")
        elif self._closing and rc == 0:
            error = ServiceUnavailable("The model was unloaded while the request was running.")
        else:
            placement = getattr(self, "placement", None)
            gpu = placement is not None and placement.device == "gpu"  # named first: a notification is short
            error = ModelCrashed(
                f"The model '{self.id}' stopped"
                + (f" (it ran on {placement.description})" if gpu and placement else "")
                + f": {self._reason(rc)}. Its running requests were ended; their output so far is kept. "
                + ("A driver error or a lost device ends this model's process only. " if gpu else "")
                + "Send the request again to load the model anew."
            )
            log.error("%s", error.detail)
        with self._lock:
            self.exit_error = error
            self._exited.set()  # from here on nothing is registered
            closing = self._closing
            jobs, self._jobs = list(self._jobs.values()), {}
            calls, self._calls = list(self._calls.values()), {}
        if not self._ready.done():
            self._ready.set_exception(error)
        for job in jobs:
            job.sink(Finish(ERROR, len(job.prompt), 0, error=error))
        for future in calls:
            future.set_result((wire.ERROR, wire.pack_json(wire.pack_error(error))))
        if loaded and isinstance(error, ModelCrashed) and not closing and self._on_exit is not None:
            try:
                self._on_exit(self, error)
            except Exception:
                log.exception("model exit listener failed")

    def _reason(self, rc: int) -> str:
        said = self._last_words()
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            if name == "SIGBUS":
                return (
                    "its file changed or was cut short while it was loaded (llama.cpp reads the weights from "
                    "the file), and the model process ended with SIGBUS"
                )
            if name == "SIGKILL":
                return "the model process was killed (SIGKILL), most often by the system when memory runs out"
            if name == "SIGABRT":
                return f"llama.cpp aborted ({said})" if said else "llama.cpp aborted (SIGABRT)"
            return f"the model process ended with {name}" + (f" ({said})" if said else "")
        return f"the model process exited with code {rc}" + (f" ({said})" if said else "")

    def _last_words(self) -> str:
        """The most telling recent stderr line: a failed assertion or error, else the last line."""
        lines = list(self._stderr_tail)
        for line in reversed(lines):
            if "GGML_ASSERT" in line or "GGML_ABORT" in line or "error" in line.lower():
                return line.strip()[:300]
        return lines[-1].strip()[:300] if lines else ""

    def _kill(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.kill()
            except OSError:
                pass

    def _reap(self) -> None:
        """After the process ended: stop the threads and close the pipes."""
        if self._proc.poll() is None:
            self._kill()
        self._proc.wait()
        self._outbox.put(None)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(5.0)
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass


def _log_level() -> int:
    return logging.getLogger("lmsp_tray").getEffectiveLevel()
