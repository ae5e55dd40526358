"""Compiling a job's grammar before it joins the batch, on a thread of its own.

llama.cpp builds a grammar sampler by parsing the GBNF and expanding its
first stacks, which for a large grammar (a long enum, a wide schema) takes
from milliseconds to seconds. Done on the scheduler thread, that time would
stall every sequence decoding in the same batch. `GrammarBuilder` compiles
the samplers a job will need — the grammar it starts under, or for a lazy
grammar one per rule its trigger may switch on — and only then queues the job
with the scheduler, which takes the ready samplers. Jobs without a grammar
never wait here.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable

import llama_cpp

from lmsp_tray.engine.jobs import CANCELLED, ERROR, Finish, GenerationJob
from lmsp_tray.errors import InternalError, InvalidRequest, LMSPError
from lmsp_tray.runner.sampler import GrammarError, Sampler
from lmsp_tray.runner.scheduler import Prepared, Scheduler

log = logging.getLogger("lmsp_tray.runner")


class GrammarBuilder:
    def __init__(
        self,
        model_id: str,
        vocab: llama_cpp.llama_vocab_p,
        scheduler: Scheduler,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._vocab = vocab
        self._scheduler = scheduler
        self._on_done = on_done  # after each job is handed on (a model process flushes its frames)
        self._jobs: queue.SimpleQueue[GenerationJob | None] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"lmsp-grammar-{model_id}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def submit(self, job: GenerationJob) -> None:
        with self._lock:
            self._pending += 1
        self._jobs.put(job)

    def close(self) -> None:
        """Stop after the jobs already handed over (they end 503 once the scheduler has stopped)."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._prepare(job)
            except Exception:
                log.exception("could not prepare a grammar job")
                _finish(job, InternalError("The output constraint could not be set up."))
            finally:
                with self._lock:
                    self._pending -= 1
                if self._on_done is not None:
                    self._on_done()

    def _prepare(self, job: GenerationJob) -> None:
        if job.cancelled:
            job.sink(Finish(CANCELLED, len(job.prompt), 0))
            return
        prepared = Prepared()
        try:
            if job.grammar_trigger is not None:
                for root in job.grammar_trigger.roots:
                    prepared.lazy[root] = Sampler(self._vocab, dataclasses.replace(job.sampling, grammar_root=root))
            else:
                prepared.initial = Sampler(self._vocab, job.sampling)
        except GrammarError as exc:
            prepared.close()
            _finish(job, InvalidRequest(f"The output constraint could not be compiled: {exc}."))
            return
        if job.cancelled:
            prepared.close()
            job.sink(Finish(CANCELLED, len(job.prompt), 0))
            return
        try:
            self._scheduler.submit(job, prepared)
        except LMSPError as exc:  # unloading, or the waiting line filled up meanwhile
            prepared.close()
            _finish(job, exc)
        except Exception:
            prepared.close()
            raise


def _finish(job: GenerationJob, error: LMSPError) -> None:
    job.sink(Finish(ERROR, len(job.prompt), 0, error=error))
