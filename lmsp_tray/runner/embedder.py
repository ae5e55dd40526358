"""The embedding model's scheduler: one thread that packs many inputs into few decodes.

An embedding model (BERT and its kin, or any GGUF with a pooling type) does
not generate: each input is one sequence, evaluated once, and its pooled
output is the vector. So instead of `scheduler.Scheduler`'s slots, this
thread keeps a FIFO of waiting inputs — from every request, in order — and
each decode takes as many as fit: at most `max_sequences` sequences and
`batch_tokens` tokens (for an encoder llama.cpp must see every sequence
whole in one micro-batch, and aborts the process otherwise, so an input never
spans two decodes and the service refuses an input longer than the window
before it gets here). Every token is an output (llama.cpp wants that in
embedding mode); the vector is llama.cpp's pooled one (`mean`, `cls`,
`last`, as the GGUF says), or the mean of the token vectors for a model
whose pooling is `none`, then L2-normalised. A reranker (`rank` pooling)
is run the same way, one (query, document) pair per input: its pooled
output is its classifier's logits, kept as they are (the first is the
relevance score llama-server reports).

A request's `done` is called once, when its last input is embedded, on this
thread (a model process sends the reply from there). A request whose client
went away is `cancel`led: its inputs still waiting leave the queue at once,
and this thread answers it `RequestCancelled` after the decode under way
(what that decode computed for it is dropped), so a large batch stops within
one decode and frees its place in the queue.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable

import llama_cpp
import numpy as np

from lmsp_tray.engine.admission import too_many, unloading
from lmsp_tray.engine.embedding import POOLING_NONE, POOLING_RANK, EmbedCancel, Embeddings, EmbedJob, normalized
from lmsp_tray.errors import InternalError, LMSPError, RequestCancelled, ServiceUnavailable
from lmsp_tray.runner.batch import Batch
from lmsp_tray.runner.handles import EmbedHandles

log = logging.getLogger("lmsp_tray.runner")


class Embedder:
    def __init__(
        self,
        model: EmbedHandles,
        *,
        max_sequences: int,
        batch_tokens: int,
        max_queue: int,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        self._model = model
        self._max_sequences = max_sequences
        self._batch_tokens = batch_tokens
        self._max_queue = max_queue
        self._on_step = on_step
        self.pooling = llama_cpp.llama_pooling_type(model.ctx)
        if self.pooling == POOLING_RANK:
            self.dimensions = max(1, llama_cpp.llama_model_n_cls_out(model.llama_model))
        else:
            self.dimensions = llama_cpp.llama_model_n_embd_out(model.llama_model) or llama_cpp.llama_model_n_embd(
                model.llama_model
            )
        self._queue: collections.deque[tuple[EmbedJob, int]] = collections.deque()  # (job, input index)
        self._cancelled: list[EmbedJob] = []  # to answer `RequestCancelled` (on this thread, under no lock)
        self._jobs = 0  # jobs submitted and not yet done
        self._cond = threading.Condition(threading.RLock())  # reentrant: `submit` binds a cancel under it
        self._stopping = False
        self._drain = False
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self._batch = Batch(batch_tokens)
        # An encoder has no KV cache: encode directly (llama_decode would say so on every call first).
        self._encode = not model.memory
        self.steps = 0
        self.cancelled_jobs = 0
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=4096)  # tokens per recent decode
        self.sequences: collections.deque[int] = collections.deque(maxlen=4096)  # inputs per recent decode
        self.last_activity = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"lmsp-embed-{model.id}", daemon=True)
        self._thread.start()

    # -- called from other threads ---------------------------------------------------------------
    def submit(self, job: EmbedJob, cancel: EmbedCancel | None = None) -> None:
        """Queue every input of `job`; 503 while unloading, 429 when `max_queue` requests wait.
        `cancel` is bound before this thread can take an input of the job (a cancel already asked
        for drops them all at once)."""
        with self._cond:
            if self._stopping or self._drain:
                raise unloading()
            if self._jobs > self._max_queue:
                raise too_many(self._jobs - 1, self._durations, 1)
            job.vectors = [None] * len(job.inputs)
            job.remaining = len(job.inputs)
            job.started = time.monotonic()
            self._jobs += 1
            self._queue.extend((job, i) for i in range(len(job.inputs)))
            self.last_activity = time.monotonic()
            if cancel is not None:  # under the (reentrant) lock: the hook may run here, and `cancel` takes it
                cancel.bind(functools.partial(self.cancel, job))
            self._cond.notify()

    def cancel(self, job: EmbedJob) -> None:
        """Stop `job` (its client went away): its waiting inputs are dropped now, and it is answered
        `RequestCancelled` on the embedder's thread after the decode under way. From any thread."""
        with self._cond:
            if job.cancelled or job.remaining <= 0 or self._stopping:
                return  # done already, or being failed by the stop
            job.cancelled = True
            self._queue = collections.deque(entry for entry in self._queue if entry[0] is not job)
            self._cancelled.append(job)
            self.cancelled_jobs += 1
            self._cond.notify()

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._jobs > 0

    @property
    def queued(self) -> int:
        with self._cond:
            return self._jobs

    def stop(self, *, drain: bool = False) -> None:
        with self._cond:
            if drain:
                self._drain = True
                self._cond.wait_for(lambda: self._jobs == 0)
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def close(self) -> None:
        if self._thread.is_alive():
            self.stop()
        self._batch.free()

    # -- the embedder thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._queue and not self._cancelled:
                        self._cond.wait()
                    if self._stopping:
                        break
                    cancelled, self._cancelled = self._cancelled, []
                    taken = self._take()
                for job in cancelled:
                    self._fail(job, RequestCancelled("The client went away; its embeddings were not computed."))
                if taken:
                    self._decode(taken)
                if self._on_step is not None:
                    self._on_step()
        except Exception:
            log.exception("embedder of %s crashed", self._model.id)
        finally:
            error = ServiceUnavailable("The model was unloaded while the request was running.")
            with self._cond:
                self._stopping = True
                left = list(dict.fromkeys([*self._cancelled, *(job for job, _ in self._queue)]))
                self._queue.clear()
                self._cancelled.clear()
            for job in left:
                self._fail(job, error)
            if self._on_step is not None:
                self._on_step()

    def _take(self) -> list[tuple[EmbedJob, int]]:
        """The waiting inputs (FIFO) that fit one decode; under the lock."""
        taken: list[tuple[EmbedJob, int]] = []
        tokens = 0
        while self._queue and len(taken) < self._max_sequences:
            job, i = self._queue[0]
            size = len(job.inputs[i])
            if taken and tokens + size > self._batch_tokens:
                break
            self._queue.popleft()
            taken.append((job, i))
            tokens += size
        return taken

    def _decode(self, taken: list[tuple[EmbedJob, int]]) -> None:
        # A failed or cancelled job's other inputs are skipped.
        live = [(job, i) for job, i in taken if job.remaining > 0 and not job.cancelled]
        if not live:
            return
        model = self._model
        batch = self._batch
        n = 0
        for seq, (job, i) in enumerate(live):
            for pos, token in enumerate(job.inputs[i]):
                batch.put(n, token, pos, seq, True)  # every token is an output in embedding mode
                n += 1
        if self._encode:
            result = batch.encode(model.ctx, n)
        else:  # a decoder with a KV cache (e.g. last-token pooling): every decode starts afresh
            llama_cpp.llama_memory_clear(model.memory, True)
            result = batch.decode(model.ctx, n)
        self.steps += 1
        self.batch_sizes.append(n)
        self.sequences.append(len(live))
        self.last_activity = time.monotonic()
        if result != 0:
            log.warning("llama_decode returned %s for %s (embeddings)", result, model.id)
            error = InternalError(f"The model failed to compute embeddings (llama_decode returned {result}).")
            for job in dict.fromkeys(job for job, _ in live):
                self._fail(job, error)
            return
        dims = self.dimensions
        if self.pooling == POOLING_NONE:
            flat = llama_cpp.llama_get_embeddings(model.ctx)
            every = np.ctypeslib.as_array(ctypes.cast(flat, ctypes.POINTER(ctypes.c_float)), shape=(n, dims))
            start = 0
            for job, i in live:
                size = len(job.inputs[i])
                self._store(job, i, every[start : start + size].mean(axis=0))
                start += size
        else:
            for seq, (job, i) in enumerate(live):
                ptr = llama_cpp.llama_get_embeddings_seq(model.ctx, seq)
                if not ptr:
                    self._fail(job, InternalError("The model gave no embedding for an input."))
                    continue
                vector = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(dims,))
                self._store(job, i, vector.copy())

    def _store(self, job: EmbedJob, i: int, vector: np.ndarray) -> None:
        if job.remaining <= 0 or job.cancelled:  # cancelled during the decode: answered by `_run`
            return
        job.vectors[i] = vector
        job.remaining -= 1
        if job.remaining == 0:
            vectors = np.stack([v for v in job.vectors if v is not None]).astype(np.float32, copy=False)
            if self.pooling != POOLING_RANK:  # a reranker's logits are scores, not directions
                vectors = normalized(vectors)
            self._done(job, Embeddings(vectors, tuple(len(t) for t in job.inputs)))

    def _fail(self, job: EmbedJob, error: LMSPError) -> None:
        if job.remaining <= 0:
            return
        job.remaining = 0
        self._done(job, error)

    def _done(self, job: EmbedJob, result: Embeddings | LMSPError) -> None:
        with self._cond:
            self._jobs -= 1
            self._durations.append(time.monotonic() - job.started)
            self._cond.notify_all()
        try:
            job.done(result)
        except Exception:
            log.exception("an embedding job's callback failed")
