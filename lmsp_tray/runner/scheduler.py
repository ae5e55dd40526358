"""The per-model scheduler: one thread that owns the llama context and steps generation.

Every running request is a sequence (a slot) in one llama context. Each step
builds one batch holding the next token of every generating sequence plus a
chunk of a newcomer's prompt, decodes it once, and samples each sequence with
its own sampler — continuous batching, so concurrent requests share decode
steps instead of queueing behind each other. Requests wait FIFO for a free
slot; a full waiting line answers `429`. A slot keeps its KV cache after its
request ends, and a new request goes to the free slot whose cached tokens
share the longest prefix with its prompt, so a continued conversation only
evaluates what is new. Cancellation (client gone) is checked before every
step, so a cancelled request stops within one decode step.

Nothing slow runs on this thread besides decoding: a request's grammar is
compiled before it gets here (`grammars.GrammarBuilder` hands over `Prepared`
samplers), so a huge grammar never stalls the sequences already decoding.
After each step `on_step` runs once (a model process flushes the step's
deltas to the service in one write).

An image is part of a prompt's tokens (`vision`: one negative id per image
position, from a hash of its pixels). A sequence keeps or drops whole images
only; when a sequence's next pending token starts an image, the step first
encodes it with the model's projector and decodes its embeddings into that
sequence (a decode of its own: a batch holds tokens or embeddings, not both),
then goes on as usual.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from lmsp_tray.engine.admission import too_many, unloading
from lmsp_tray.engine.jobs import (
    CANCELLED,
    CONTEXT,
    ERROR,
    LENGTH,
    STOP,
    Finish,
    FinishReason,
    GenerationJob,
    GrammarOn,
    GrammarTrigger,
    TokenLogprob,
)
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.errors import ContextLengthExceeded, InternalError, InvalidRequest, LMSPError, ServiceUnavailable
from lmsp_tray.runner import kv_states
from lmsp_tray.runner.batch import Batch, even_drafts, micro_batches, warm_up
from lmsp_tray.runner.cpu_share import YieldingThreads
from lmsp_tray.runner.draft_model import MAX_MODEL_DRAFT, DraftModel, DraftWant
from lmsp_tray.runner.handles import DecodeHandles
from lmsp_tray.runner.prompt_cache import PromptCache, common_prefix
from lmsp_tray.runner.sampler import GrammarError, Sampler
from lmsp_tray.runner.speculation import Drafter, DrafterFactory, Drafting, PromptLookup, Recent
from lmsp_tray.runner.swa import Windows, checkpoint_tail
from lmsp_tray.runner.textstream import TextStream
from lmsp_tray.runner.vision import Vision, image_start, is_image, text_run

log = logging.getLogger("lmsp_tray.runner")

IDLE_SAVE_S = 30.0  # a model idle this long writes its sequences' states to the prompt cache
# A newcomer gives up this many tokens of cached prefix for a slot that leaves the running sequences' ids
# without a gap: a gap costs every decode step of a model bound by memory another pass (1.9x the step,
# measured), a few dozen tokens of prompt cost a pass or two once.
PREFIX_SLACK = 64


@dataclass(eq=False)
class Prepared:
    """Samplers built for a job before it reached the scheduler: the one it starts with, and for a
    lazy grammar one per rule its trigger may switch on from."""

    initial: Sampler | None = None
    lazy: dict[str, Sampler] = field(default_factory=dict)

    def close(self) -> None:
        for sampler in (self.initial, *self.lazy.values()):
            if sampler is not None:
                sampler.close()
        self.initial, self.lazy = None, {}


@dataclass(eq=False)
class _Slot:
    seq_id: int
    cache: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds
    job: GenerationJob | None = None
    pending: Sequence[int] = ()  # prompt tokens still to evaluate
    tail: int = -1  # the window checkpoint is taken when this many prompt tokens are pending (-1: none)
    stable: int = 0  # a stable checkpoint is taken once the sequence holds this many tokens (0: none)
    last_token: int = -1  # sampled, not yet decoded
    generated: int = 0
    reused: int = 0
    sampler: Sampler | None = None
    prepared: Prepared | None = None  # samplers built ahead for this job (lazy grammar rules)
    trigger: GrammarTrigger | None = None
    stream: TextStream | None = None
    grammar_on: bool = False  # a lazy grammar has been switched on
    admitted: int = 0  # admission order (FIFO among prompt chunks)
    last_used: float = 0.0
    lookup: Drafter | None = None  # the job's tokens, for speculative drafts (None: not drafting)
    drafting: Drafting | None = None
    guessing: Drafting | None = None  # how much the draft model drafts for this sequence (None: it does not)
    saved: bool = True  # the prompt cache holds this sequence's KV as it is now (or need not)
    # per step
    fed: Sequence[int] = ()
    out: int = -1
    draft: Sequence[int] = ()
    guessed: bool = False  # the draft came from the draft model (not prompt lookup)


class Scheduler:
    def __init__(
        self,
        model: DecodeHandles,
        *,
        parallel: int,
        context_per_sequence: int,
        batch_size: int,
        max_queue: int,
        busy_prompt_chunk: int = 256,
        speculative: bool = True,
        prompt_cache: PromptCache | None = None,
        idle_save_s: float = IDLE_SAVE_S,
        on_step: Callable[[], None] | None = None,
        warm_up: int | None = None,
        vision: Vision | None = None,
        draft_model: DraftModel | None = None,
        threads: YieldingThreads | None = None,
    ) -> None:
        """`draft_model`: a small model of the same vocabulary that drafts where prompt lookup proposes
        nothing (speculative only). `threads`: how many CPU threads each decode uses, fewer while other
        programs keep cores busy (None: the context's own count, always)."""
        self._model = model
        self._threads = threads
        self.threads_used = threads.most if threads is not None else 0  # the count set on the context (observable)
        self._draft_model = draft_model if speculative else None
        self._vision = vision
        self._speculative = speculative
        self.prompt_cache = prompt_cache
        self._idle_save_s = idle_save_s
        self.recent = Recent()  # finished sequences, where a request asked again finds its earlier answer
        self.drafter: DrafterFactory = functools.partial(PromptLookup, recent=self.recent)  # proposes drafts
        self._on_step = on_step
        self._slots = [_Slot(i) for i in range(parallel)]
        n_swa = model.n_swa
        self.windows = Windows(model.ctx, model.memory, n_swa) if n_swa > 0 else None  # sliding-window layers
        self._ctx_seq = context_per_sequence
        self._batch_size = batch_size
        self._busy_chunk = min(busy_prompt_chunk, batch_size)
        self._max_queue = max_queue
        self._queue: collections.deque[GenerationJob] = collections.deque()
        self._prepared: dict[GenerationJob, Prepared] = {}  # queued jobs' samplers built ahead
        self._cond = threading.Condition()
        self._ready = threading.Event()  # set once the thread has warmed llama.cpp up
        self._stopping = False
        self._drain = False
        self._admissions = 0
        self._batch = Batch(batch_size)
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self.steps = 0  # decode steps performed (observable by tests and the tray)
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=4096)  # tokens per recent step
        self.drafted = 0  # speculative draft tokens verified, and of those kept (observable)
        self.accepted = 0
        self.model_drafted = 0  # of those, the draft model's (observable)
        self.model_accepted = 0
        self._step_seconds = 0.0  # a decode step of generating sequences alone, recently (what a kept guess saves)
        self.last_activity = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(warm_up,), name=f"lmsp-model-{model.id}", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- called from other threads ---------------------------------------------------------------
    def submit(self, job: GenerationJob, prepared: Prepared | None = None) -> None:
        """Queue `job` (FIFO); `prepared` holds samplers already built for it (the scheduler owns them
        from now on). Raises 503 while unloading and 429 when the waiting line is full."""
        with self._cond:
            self._check_admission()
            self._queue.append(job)
            if prepared is not None:
                self._prepared[job] = prepared
            self.last_activity = time.monotonic()
            self._cond.notify()

    def check_admission(self) -> None:
        """Raise what `submit` would raise now (503 while unloading, 429 when the line is full)."""
        with self._cond:
            self._check_admission()

    def _check_admission(self) -> None:
        if self._stopping or self._drain:
            raise unloading()
        waiting = len(self._queue)
        free = sum(1 for s in self._slots if s.job is None)
        if waiting >= self._max_queue and free == 0:
            raise too_many(waiting, self._durations, len(self._slots))

    @property
    def busy(self) -> bool:
        """True while any request is waiting or generating (the model must not be evicted)."""
        with self._cond:
            return bool(self._queue) or any(s.job is not None for s in self._slots)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def generating(self) -> int:
        with self._cond:
            return sum(1 for s in self._slots if s.job is not None)

    def running(self) -> list[int]:
        """The sequence ids that hold a request now, in order (a snapshot, read from any thread)."""
        return [slot.seq_id for slot in self._slots if slot.job is not None]

    def stop(self, *, drain: bool = False, timeout: float | None = None) -> None:
        """Stop the thread. With `drain`, running and queued requests finish first."""
        with self._cond:
            if drain:
                self._drain = True
            else:
                self._stopping = True
            self._cond.notify()
        if drain:
            with self._cond:
                self._cond.wait_for(lambda: not self._queue and all(s.job is None for s in self._slots), timeout)
                self._stopping = True
                self._cond.notify()
        self._thread.join(timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self.stop()
        self._batch.free()

    # -- the scheduler thread -------------------------------------------------------------------
    def _run(self, warm_token: int | None) -> None:
        try:
            if warm_token is not None:  # on this thread: llama.cpp's CPU threads belong to the one decoding
                warm_up(self._model.ctx, self._model.memory, warm_token)
                if self._draft_model is not None:
                    self._draft_model.warm_up()
            self._ready.set()
            while True:
                save = False
                with self._cond:
                    while not self._stopping and not self._queue and all(s.job is None for s in self._slots):
                        self._cond.notify_all()  # wakes a draining stop()
                        if self.prompt_cache is not None:
                            self.prompt_cache.quiet.set()  # no request runs: saved states may be written
                        if self.prompt_cache is None or all(s.saved for s in self._slots):
                            self._cond.wait()
                        elif not self._cond.wait(self._idle_save_s) and not self._queue and not self._stopping:
                            save = True  # idle a while with unsaved sequences: save them now
                            break
                    if self._stopping:
                        break
                    admitted = [] if save else self._admit()
                if save:
                    self.save_states()
                    continue
                if self.prompt_cache is not None:
                    self.prompt_cache.quiet.clear()  # a request runs: writes wait between slices
                for slot in admitted:
                    self._prepare(slot)
                self._step()
                self._flush()
        except Exception:  # never leave callers waiting forever
            log.exception("scheduler of %s crashed", self._model.id)
        finally:
            self._ready.set()
            error = ServiceUnavailable("The model was unloaded while the request was running.")
            with self._cond:
                self._stopping = True
                queued, self._queue = list(self._queue), collections.deque()
                prepared, self._prepared = list(self._prepared.values()), {}
                self._cond.notify_all()
            for slot in self._slots:
                if slot.job is not None:
                    self._finish(slot, ERROR, error)
            for job in queued:
                _emit(job, Finish(ERROR, len(job.prompt), 0, error=error))
            for samplers in prepared:
                samplers.close()
            self._flush()

    def _flush(self) -> None:
        if self._on_step is not None:
            try:
                self._on_step()
            except Exception:
                log.exception("the step hook of %s failed", self._model.id)

    def _admit(self) -> list[_Slot]:
        """Move waiting jobs into free slots (FIFO), choosing slots by longest cached prefix, then fewest gaps."""
        admitted: list[_Slot] = []
        while self._queue:
            free = [s for s in self._slots if s.job is None]
            if not free:
                break
            job = self._queue.popleft()
            prepared = self._prepared.pop(job, None)
            if job.cancelled:
                if prepared is not None:
                    prepared.close()
                _emit(job, Finish(CANCELLED, len(job.prompt), 0))
                continue
            best = self._slot_for(job.prompt, free)
            best.job = job
            best.prepared = prepared
            self._admissions += 1
            best.admitted = self._admissions
            admitted.append(best)
        return admitted

    def _slot_for(self, prompt: Sequence[int], free: list[_Slot]) -> _Slot:
        """The free slot for a prompt: one that holds about the longest of its prefix (within
        `PREFIX_SLACK` tokens), of those one that keeps the running sequences' ids together (a gap costs
        each step another pass over the weights: `batch.micro_batches`), then the longest prefix, then
        the least recently used."""
        running = [s.seq_id for s in self._slots if s.job is not None]
        prefixes = {s.seq_id: common_prefix(s.cache, prompt) for s in free}
        longest = max(prefixes.values())
        return max(
            (s for s in free if prefixes[s.seq_id] >= longest - PREFIX_SLACK),
            key=lambda s: (-micro_batches([*running, s.seq_id]), prefixes[s.seq_id], -s.last_used),
        )

    def _prepare(self, slot: _Slot) -> None:
        job = slot.job
        assert job is not None
        job.started_at = time.monotonic()
        if self.prompt_cache is not None:
            self._restore(slot, job.prompt)
        keep = image_start(job.prompt, min(common_prefix(slot.cache, job.prompt), len(job.prompt) - 1))
        if self.windows is not None:
            keep = self.windows.resume_at(slot.seq_id, keep)
        if keep < len(slot.cache):
            slot.saved = False
        mem = self._model.memory
        if not llama_cpp.llama_memory_seq_rm(mem, slot.seq_id, keep, -1):
            self._clear(slot.seq_id)
            keep = 0
        del slot.cache[keep:]
        slot.pending = job.prompt[keep:]
        slot.tail = -1 if self.windows is None else checkpoint_tail(len(slot.pending))
        if self.windows is not None and slot.tail == len(slot.pending):
            self.windows.take(slot.seq_id)  # before a short addition: a point to come back to
        stable = job.stable_prefix  # where the next conversation will part from this one
        slot.stable = stable if self.windows is not None and keep < stable < len(job.prompt) else 0
        slot.reused = keep
        slot.generated = 0
        slot.last_token = -1
        slot.lookup = None
        slot.drafting = Drafting() if self._speculative else None
        # The draft model reads token ids only: a prompt with images (negative ids) is not for it.
        images = any(is_image(t) for t in job.prompt) if self._vision is not None else False
        guess = self._draft_model is not None and not images
        slot.guessing = Drafting() if guess else None
        slot.stream = TextStream(job.stop, grammar_utf8=job.sampling.grammar is not None)
        sampling = job.sampling
        slot.grammar_on = False
        slot.trigger = None
        if job.grammar_trigger is not None:  # a lazy grammar starts switched off
            sampling = dataclasses.replace(sampling, grammar=None)
            slot.trigger = job.grammar_trigger.start()
        prepared = slot.prepared
        if prepared is not None and prepared.initial is not None:
            slot.sampler, prepared.initial = prepared.initial, None
        else:
            slot.sampler = self._new_sampler(slot, sampling)

    def _restore(self, slot: _Slot, prompt: Sequence[int]) -> None:
        """Load a saved state into the slot when it covers much more of `prompt` than the slot holds."""
        assert self.prompt_cache is not None
        model = self._model
        held = common_prefix(slot.cache, prompt)
        restored = kv_states.restore_best(
            model.ctx, model.memory, slot.seq_id, self.prompt_cache, self.windows, prompt, held
        )
        if restored is not None:
            slot.cache = list(restored)
            slot.saved = True
            if restored:
                log.info("%s: restored %d tokens from the prompt cache", model.id, len(restored))

    def save_states(self) -> None:
        """Hand every sequence's KV state not yet saved to the prompt cache's writer (on this thread,
        or on another once this one has stopped: the copy out of the context is all it costs here)."""
        cache = self.prompt_cache
        if cache is None:
            return
        for slot in self._slots:
            if slot.saved or slot.job is not None:
                continue
            slot.saved = True
            kv_states.save(self._model.ctx, slot.seq_id, cache, slot.cache, self.windows)

    def _new_sampler(self, slot: _Slot, sampling: SamplingParams) -> Sampler | None:
        """A sampler for the slot's request; None (and the request ended) if its grammar won't compile."""
        try:
            return Sampler(self._model.vocab, sampling)
        except GrammarError as exc:
            self._finish(slot, ERROR, InvalidRequest(f"The output constraint could not be compiled: {exc}."))
        except Exception:  # a sampler llama.cpp cannot build fails this request, not the model's thread
            log.exception("could not build a sampler for %s", self._model.id)
            self._finish(slot, ERROR, InternalError("The sampler for this request could not be set up."))
        return None

    def _switch_grammar_on(self, slot: _Slot, root: str) -> bool:
        """A lazy grammar's trigger fired: decode on under the grammar, from rule `root`."""
        job = slot.job
        assert job is not None
        ready = slot.prepared.lazy.pop(root, None) if slot.prepared is not None else None
        sampler = ready or self._new_sampler(slot, dataclasses.replace(job.sampling, grammar_root=root))
        if sampler is None:
            return False
        if slot.sampler is not None:
            slot.sampler.close()
        slot.sampler = sampler
        slot.grammar_on = True
        return True

    def _step(self) -> None:
        active = [s for s in self._slots if s.job is not None]
        for slot in active:
            if slot.job is not None and slot.job.cancelled:
                self._finish(slot, CANCELLED)
        for slot in active:
            if slot.job is not None and slot.pending and is_image(slot.pending[0]):
                self._evaluate_image(slot)
        active = [s for s in active if s.job is not None]
        if not active:
            return
        batch = self._batch
        n = 0
        decoding = [s for s in active if not s.pending]
        spare = self._batch_size - len(decoding)  # room for drafts
        for slot in active:
            slot.fed, slot.out, slot.draft, slot.guessed = (), -1, (), False
        drafts: dict[int, Sequence[int]] = {}
        wants: list[DraftWant] = []
        for slot in decoding:
            draft = self._draft(slot, spare, len(decoding) == 1)
            spare -= len(draft)
            drafts[slot.seq_id] = draft
            if not draft and slot.guessing is not None:  # free-form text here: the draft model may guess
                limit = min(slot.guessing.limit(), MAX_MODEL_DRAFT, spare, self._room(slot))
                if limit > 0:
                    spare -= limit
                    wants.append(DraftWant(slot.seq_id, slot.cache, slot.last_token, limit))
        draft_model = self._draft_model
        payoff = draft_model.payoff if draft_model is not None else None
        # Guessing waits for a plain step's time (what a kept guess saves), then goes on while it pays.
        if wants and draft_model is not None and (payoff is None or (self._step_seconds > 0 and payoff.allowed())):
            started = time.perf_counter()
            guesses = draft_model.propose(wants)
            if payoff is not None:
                payoff.spend(time.perf_counter() - started, sum(len(g) for g in guesses.values()))
            for seq, guess in guesses.items():
                drafts[seq] = guess
            for slot in decoding:
                slot.guessed = slot.seq_id in guesses
        drafts = even_drafts(drafts)  # one draft length a step: fewer passes over the weights
        for slot in decoding:
            slot.draft = drafts[slot.seq_id]
            slot.fed = (slot.last_token, *slot.draft)
        stepping = sum(len(slot.fed) for slot in decoding)  # a step of these alone is what a kept guess saves
        budget = (self._batch_size if stepping == 0 else self._busy_chunk) - stepping
        for slot in sorted((s for s in active if s.pending), key=lambda s: s.admitted):
            if budget <= 0:
                break
            ahead = len(slot.pending) - slot.tail  # before the checkpoint: the tail goes in after it
            to_stable = slot.stable - len(slot.cache)  # likewise the stable prefix's checkpoint
            text = text_run(slot.pending)  # up to the next image (evaluated at the start of a step)
            slot.fed = slot.pending[: min([budget, text, *(n for n in (ahead, to_stable) if n > 0)])]
            budget -= len(slot.fed)
        for slot in active:  # in sequence order, as llama.cpp's micro-batches want them (`batch.micro_batches`)
            pos = len(slot.cache)
            if not slot.pending:  # generating: each position's output verifies the draft
                slot.out = n
                for j, token in enumerate(slot.fed):
                    batch.put(n + j, token, pos + j, slot.seq_id, True)
            elif slot.fed:  # a prompt chunk: the output of the prompt's last token only
                last = len(slot.fed) == len(slot.pending)
                slot.out = n + len(slot.fed) - 1 if last else -1
                for j, token in enumerate(slot.fed):
                    batch.put(n + j, token, pos + j, slot.seq_id, last and j == len(slot.fed) - 1)
            n += len(slot.fed)
        if self._threads is not None:
            wanted = self._threads.threads()
            if wanted != self.threads_used:
                llama_cpp.llama_set_n_threads(self._model.ctx, wanted, wanted)
                log.debug("%s decodes with %d threads (other programs use %.1f CPUs)", self._model.id, wanted,
                          self._threads.others)  # fmt: skip
                self.threads_used = wanted
        started = time.perf_counter()
        result = batch.decode(self._model.ctx, n)
        if n == stepping == len(decoding):  # one token per sequence, no prompt, no drafts: a plain step
            took = time.perf_counter() - started
            self._step_seconds = took if not self._step_seconds else 0.8 * self._step_seconds + 0.2 * took
        self.steps += 1
        self.batch_sizes.append(n)
        self.last_activity = time.monotonic()
        if result != 0:
            self._decode_failed(active, result)
            return
        for slot in active:
            if not slot.fed:
                continue
            if slot.draft:
                self._verify(slot)
                continue
            slot.cache.extend(slot.fed)
            slot.saved = False
            if slot.pending:
                slot.pending = slot.pending[len(slot.fed) :]
                if self.windows is not None and len(slot.cache) == slot.stable:
                    self.windows.take(slot.seq_id, stable=True)  # the next conversation goes on from here
                elif slot.pending and len(slot.pending) == slot.tail and self.windows is not None:
                    self.windows.take(slot.seq_id)  # all but the prompt's tail is in: a point to come back to
            if slot.out >= 0:
                assert slot.sampler is not None
                try:
                    token = slot.sampler.sample(self._model.ctx, slot.out)
                except GrammarError as exc:  # a grammar with no way on: end this request, not the thread
                    self._finish(slot, ERROR, InternalError(f"The output constraint cannot be continued: {exc}."))
                    continue
                logprob = None
                job = slot.job
                if job is not None and job.logprobs is not None and not self._model.is_eog(token):
                    logprob = self._logprob(slot.out, token, job.logprobs)
                self._on_token(slot, token, logprob)

    def _draft(self, slot: _Slot, spare: int, alone: bool) -> Sequence[int]:
        """Tokens to verify after the slot's next one (prompt lookup), within what may still fit."""
        drafting, job = slot.drafting, slot.job
        if drafting is None or job is None:
            return ()
        room = min(spare, self._room(slot))
        limit = min(drafting.limit(), room)  # 0 while short drafts are paused: long matches still draft
        if room <= 0:
            return ()
        lookup = slot.lookup
        if lookup is None:  # indexed when first needed: the prompt and what was generated since
            lookup = slot.lookup = self.drafter([*slot.cache, slot.last_token])
        draft = lookup.draft(max(limit, 0), room, loop=alone)  # around a loop only for a stream alone
        return draft[: text_run(draft)]  # an image's ids are not tokens to feed

    def _room(self, slot: _Slot) -> int:
        """The longest draft the slot's sequence may verify now."""
        job = slot.job
        assert job is not None
        return min(
            self._ctx_seq - len(slot.cache) - 2,  # every drafted position must fit the window
            job.max_tokens - slot.generated - 1,  # a step emits up to the draft and one more token
        )

    def _evaluate_image(self, slot: _Slot) -> None:
        """Encode the image the slot's pending tokens start with and decode it into its sequence."""
        job = slot.job
        assert job is not None
        ident = slot.pending[0]
        image = job.media.get(ident)
        n = image.n_tokens if image is not None else 0
        started = time.perf_counter()
        try:
            done = (
                self._vision is not None
                and image is not None
                and list(slot.pending[:n]) == [ident] * n
                and self._vision.evaluate(self._model.ctx, image, len(slot.cache), slot.seq_id, self._batch_size)
            )
        except Exception:  # an image llama.cpp cannot take fails its request, not the model's thread
            log.exception("%s: evaluating an image failed", self._model.id)
            done = False
        self.steps += 1
        self.last_activity = time.monotonic()
        if not done:
            self._clear(slot.seq_id)
            slot.cache.clear()
            self._finish(slot, ERROR, InternalError("The model could not evaluate an image of the input."))
            return
        log.debug("%s: an image of %d tokens in %.3f s", self._model.id, n, time.perf_counter() - started)
        slot.cache.extend(slot.pending[:n])
        slot.pending = slot.pending[n:]
        slot.saved = False

    def _verify(self, slot: _Slot) -> None:
        """After a speculative step: sample each position in order, keep draft tokens while they
        equal what the sequence's own sampler picks there, and drop the rest from the KV cache."""
        sampler, draft, base = slot.sampler, slot.draft, len(slot.cache)
        slot.saved = False
        assert sampler is not None and slot.drafting is not None
        kept = 0
        for i in range(len(draft) + 1):
            try:
                token = sampler.sample(self._model.ctx, slot.out + i)
            except GrammarError as exc:
                self._finish(slot, ERROR, InternalError(f"The output constraint cannot be continued: {exc}."))
                break
            slot.cache[base:] = slot.fed[: i + 1]  # the tokens whose KV is held, up to this position
            job = slot.job  # a verified draft token has its log probability like any other
            logprob = None
            if job is not None and job.logprobs is not None and not self._model.is_eog(token):
                logprob = self._logprob(slot.out + i, token, job.logprobs)
            self._on_token(slot, token, logprob)
            if slot.job is None:
                break
            sampler = slot.sampler  # a lazy grammar may have switched on
            assert sampler is not None
            if i == len(draft) or token != draft[i]:
                break
            kept += 1
        if slot.guessed:
            assert slot.guessing is not None
            slot.guessing.record(len(draft), kept)
            payoff = self._draft_model.payoff if self._draft_model is not None else None
            if payoff is not None:
                payoff.keep(kept, self._step_seconds)
            self.model_drafted += len(draft)
            self.model_accepted += kept
        else:
            slot.drafting.record(len(draft), kept)
        self.drafted += len(draft)
        self.accepted += kept
        mem = self._model.memory  # the rejected drafts' KV goes; the next step writes there
        if not llama_cpp.llama_memory_seq_rm(mem, slot.seq_id, len(slot.cache), -1) and slot.job is not None:
            self._clear(slot.seq_id)
            slot.cache.clear()
            self._finish(slot, ERROR, InternalError("The model's memory could not drop a rejected draft."))

    def _decode_failed(self, active: list[_Slot], code: int) -> None:
        if code == 1:
            error: LMSPError = ContextLengthExceeded(
                "The model's memory for this conversation is full; shorten the input or max_output_tokens."
            )
        else:
            error = InternalError(f"The model failed to decode (llama_decode returned {code}).")
        log.warning("llama_decode returned %s for %s", code, self._model.id)
        for slot in active:
            if slot.fed:
                self._clear(slot.seq_id)
                slot.cache.clear()
                self._finish(slot, ERROR, error)

    def _clear(self, seq_id: int) -> None:
        """Empty a sequence's KV (and forget its checkpoints)."""
        llama_cpp.llama_memory_seq_rm(self._model.memory, seq_id, -1, -1)
        if self.windows is not None:
            self.windows.drop(seq_id)

    def _logprob(self, index: int, token: int, top: int) -> TokenLogprob:
        """The token's log probability from the raw logits of output `index` (before sampling settings)."""
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(self._model.ctx, index), shape=(self._model.n_vocab,)
        )
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
        best: tuple[tuple[bytes, float], ...] = ()
        if top > 0:
            ids = np.argpartition(logits, -top)[-top:]
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            best = tuple((self._model.piece(int(i), special=True), float(logits[i]) - log_total) for i in ids)
        return TokenLogprob(self._model.piece(token, special=True), float(logits[token]) - log_total, best)

    def _on_token(self, slot: _Slot, token: int, logprob: TokenLogprob | None = None) -> None:
        job = slot.job
        assert job is not None and slot.stream is not None
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
        if self._model.is_eog(token) or token in job.stop_tokens:
            self._finish(slot, STOP)
            return
        slot.generated += 1
        piece = self._model.piece(token, special=token in job.visible_tokens)
        if slot.trigger is not None and not slot.grammar_on:
            root = slot.trigger(piece)
            if root is not None:
                if not self._switch_grammar_on(slot, root):
                    return
                _emit(job, GrammarOn(root))  # before the text holding the marker: the parser reads it in order
        if logprob is not None:
            _emit(job, logprob)
        text = slot.stream.push(piece)
        if text:
            _emit(job, text)
        if slot.stream.stopped:
            self._finish(slot, STOP)
        elif slot.generated >= job.max_tokens:
            self._finish(slot, LENGTH)
        elif len(slot.cache) >= self._ctx_seq:
            self._finish(slot, CONTEXT)
        else:
            slot.last_token = token
            if slot.lookup is not None:
                slot.lookup.append(token)

    def _finish(self, slot: _Slot, reason: FinishReason, error: LMSPError | None = None) -> None:
        job = slot.job
        assert job is not None
        matched = slot.stream.stopped_by if slot.stream is not None and reason == STOP else None
        if error is None and slot.stream is not None:
            rest = slot.stream.flush()
            if rest:
                _emit(job, rest)
        if slot.sampler is not None:
            slot.sampler.close()
            slot.sampler = None
        if slot.prepared is not None:
            slot.prepared.close()
            slot.prepared = None
        slot.trigger = None
        if isinstance(slot.lookup, PromptLookup) and error is None:
            self.recent.add(slot.lookup)
        slot.job = None
        slot.pending = ()
        slot.stream = None
        slot.last_used = time.monotonic()
        if job.started_at is not None:
            self._durations.append(slot.last_used - job.started_at)
        finish = Finish(reason, len(job.prompt), slot.generated, cached_tokens=slot.reused, error=error)
        _emit(job, dataclasses.replace(finish, stop_sequence=matched) if matched is not None else finish)


def _emit(job: GenerationJob, item: str | GrammarOn | TokenLogprob | Finish) -> None:
    """Hand an item to the job's sink; a sink that fails (its consumer is gone) fails alone."""
    try:
        job.sink(item)
    except Exception:
        log.exception("a job's sink failed")
