"""A loaded model: the llama.cpp model and context, its vocabulary, template and scheduler.

Loading decides where the model runs (all layers on the GPU when one is
present and they fit, else the CPU with one thread per physical core),
the context window (min of the trained length and the configured cap, or
a window sized from memory: `load_plan.auto_window`), and how many sequences decode together. The object then
answers what the service needs: render a conversation, tokenize it, and
submit a generation job to the scheduler thread that owns the context (jobs
with a grammar go through `grammars.GrammarBuilder` first). It runs inside a
model process (`worker`) in the service, and in this process in tests.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import GGUFError, token_text_lengths
from lmsp_tray.engine.devices import physical_cores
from lmsp_tray.engine.embedding import EmbedCancel, Embeddings, EmbedDone, EmbedJob
from lmsp_tray.engine.jobs import IMAGE_SLOT, AudioClip, GenerationJob, ImagePixels
from lmsp_tray.engine.load_plan import LoadOptions, LoadPlan, plan_load, without_draft, without_projector
from lmsp_tray.engine.loaded import ModelStats, Placement
from lmsp_tray.engine.templates import BUILTIN_TEMPLATES, ChatTemplate, builtin_template_name
from lmsp_tray.errors import (
    ContextLengthExceeded,
    InputTooLong,
    InvalidRequest,
    LMSPError,
    ModelLoadFailed,
    UnsupportedCapability,
)
from lmsp_tray.protocol.images import IMAGE_MARKER
from lmsp_tray.runner import backends, kv_states
from lmsp_tray.runner.cpu_share import YieldingThreads
from lmsp_tray.runner.draft_model import DraftModel, DraftRefused
from lmsp_tray.runner.embedder import Embedder
from lmsp_tray.runner.grammars import GrammarBuilder
from lmsp_tray.runner.handles import free_handles
from lmsp_tray.runner.prompt_cache import PromptCache
from lmsp_tray.runner.prompt_tokens import PromptTokenizer, SpecialToken, turn_markers
from lmsp_tray.runner.runtime import Runtime
from lmsp_tray.runner.scheduler import Scheduler
from lmsp_tray.runner.vision import Vision

log = logging.getLogger("lmsp_tray.runner")

# Texts longer than this (and than the window) are first checked against the window by length alone.
SHORTCUT_FROM_CHARS = 1 << 16
# An embedding model decodes up to this many inputs together (llama.cpp's limit is higher).
EMBED_SEQUENCES = 64
_SPLIT_ATTRS = (
    llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
)


# What llama.cpp logs when a device cannot hold what a load asks of it (a weights, KV cache or compute buffer
# it could not allocate: "unable to allocate Vulkan0 buffer", "failed to allocate compute buffers", CUDA's
# "out of memory", Vulkan's ErrorOutOfDeviceMemory).
OUT_OF_MEMORY_SIGNS = ("alloc", "out of memory", "outofdevicememory")


def out_of_memory(log_lines: Sequence[str]) -> str | None:
    """The line of llama.cpp's log of a failed load that says a device ran out of memory, or None."""
    return next((line for line in log_lines if any(sign in line.lower() for sign in OUT_OF_MEMORY_SIGNS)), None)


def fewer_layers(planned: int) -> list[int]:
    """The GPU layers a load tries, in order, when the device runs out of memory: as planned, half, a
    quarter, then none (the CPU alone)."""
    return [*sorted({n for n in (planned, planned // 2, planned // 4) if n > 0}, reverse=True), 0]


def llama_longest_piece(vocab: Any, n_vocab: int) -> int:
    """`LlamaModel.longest_piece` as llama.cpp answers it, token by token: each token's text and piece
    (two calls each; what a file whose vocabulary the header reader cannot read falls back on)."""
    longest = 0
    buf = ctypes.create_string_buffer(256)  # not the scheduler's buffer: this runs on another thread
    for token in range(n_vocab):
        raw = llama_cpp.llama_vocab_get_text(vocab, token) or b""
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, True)
        longest = max(longest, len(raw), abs(n))  # negative: the size it would need
    return longest + 1


class LlamaModel:
    """A model loaded into memory with its own scheduler thread."""

    def __init__(
        self,
        runtime: Runtime,
        entry: ModelEntry,
        options: LoadOptions,
        plan: LoadPlan | None = None,
        *,
        on_step: Callable[[], None] | None = None,
        on_load_progress: Callable[[float], None] | None = None,
    ) -> None:
        """Load `entry`; `on_step` runs after every decode step and every job the grammar builder
        hands on (a model process flushes its frames there)."""
        self.id = entry.id
        self.entry = entry
        self.options = options
        self.loaded_at = time.time()
        self.loaded_monotonic = time.monotonic()
        self._model = None
        self._ctx = None
        self.scheduler: Scheduler | None = None
        self.prompt_cache: PromptCache | None = None  # saved sequence states (a generation model, when on)
        self.embedder: Embedder | None = None  # instead of the scheduler, for an embedding model
        self.vision: Vision | None = None  # the projector, when the model has one that loads
        self.draft_model: DraftModel | None = None  # the small model that drafts for it, when planned and usable
        # A reranker runs as an embedding model does: its pooled output is its classifier's score.
        self.reranker = bool(entry.info and entry.info.rerank)
        self.embeddings = bool(entry.info and entry.info.embeddings) or self.reranker
        self._grammars: GrammarBuilder | None = None
        self._on_step = on_step
        self._prompt_tokenizer: PromptTokenizer | None = None  # built in the background at load
        self._prompt_tokenizer_lock = threading.Lock()
        self._prompt_tokenizer_thread: threading.Thread | None = None
        self._split: list[SpecialToken] | None = None  # the vocabulary's special tokens
        self._loaded = threading.Event()  # set when the load ended, loaded or not
        self._on_load_progress = on_load_progress
        started = time.monotonic()
        mark = runtime.mark()
        free = runtime.devices.gpu_free_bytes
        self.plan = plan or plan_load(entry, options, gpu_free_bytes=free, cores=physical_cores())
        self.gpu_fallback: str | None = None  # why fewer layers run on the GPU than planned
        self._projector_failed: str | None = None  # why libmtmd did not load the projector (text only)
        self._draft_failed: str | None = None  # why the planned draft model was not loaded
        self.placement: Placement  # where it runs: set by the load
        try:
            self._load_fitting(runtime, entry, options)
        except ModelLoadFailed:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - llama.cpp surprises become a clear load failure
            self.close()
            raise ModelLoadFailed(f"Could not load '{entry.id}': {exc}") from None
        finally:
            self._loaded.set()
            self._log_tail = runtime.messages_since(mark)
        self.load_seconds = time.monotonic() - started
        log.info(
            "loaded %s on %s (%d/%d layers on GPU, %d threads, context %d x %d sequences) in %.2fs",
            self.id,
            self.placement.device,
            self.placement.gpu_layers,
            self.placement.total_layers,
            self.placement.threads,
            self.context_length,
            self.parallel,
            self.load_seconds,
        )

    def _load_fitting(self, runtime: Runtime, entry: ModelEntry, options: LoadOptions) -> None:
        """Load as planned; when the GPU runs out of memory (the plan's estimate was wrong: another program
        took memory, llama.cpp needs more than estimated), again with fewer layers, then on the CPU alone,
        saying so (`gpu_fallback`, the log). Any other failure ends the load."""
        planned = self.plan.gpu_layers
        failures: list[str] = []
        for layers in fewer_layers(planned):
            plan = dataclasses.replace(self.plan, gpu_layers=layers)
            mark = runtime.mark()
            try:
                self._load(runtime, entry, options, plan)
            except ModelLoadFailed:
                said = out_of_memory(runtime.messages_since(mark))
                if layers == 0 or said is None:
                    raise
                self._release()
                failures.append(said)
                log.warning("%s: the GPU ran out of memory with %d layers; trying fewer (%s)", self.id, layers, said)
                continue
            self.plan = without_projector(plan, self._projector_failed) if self._projector_failed else plan
            if self._draft_failed:
                self.plan = without_draft(self.plan, self._draft_failed)
            if failures:
                gpus = ", ".join(g.name for g in runtime.devices.gpus) or "the GPU"
                self.gpu_fallback = (
                    f"{gpus} ran out of memory with {planned} of {plan.total_layers} layers planned "
                    f"(llama.cpp: {failures[0]}); "
                    + (f"{layers} run on the GPU" if layers else "it runs on the CPU alone")
                )
                log.warning("%s: %s", self.id, self.gpu_fallback)
                self.placement = dataclasses.replace(self.placement, gpu_fallback=self.gpu_fallback)
            return

    def _release(self) -> None:
        """Free what a failed load attempt made, before the next one."""
        if self._prompt_tokenizer_thread is not None:
            self._loaded.set()  # it waits for the load's end, then finds no context and stops
            self._prompt_tokenizer_thread.join()
            self._prompt_tokenizer_thread = None
            self._loaded.clear()
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None
        free_handles(self._ctx, self._model)
        self._ctx = self._model = None

    def _load(self, runtime: Runtime, entry: ModelEntry, options: LoadOptions, plan: LoadPlan) -> None:
        mark = runtime.mark()
        gpu_layers, total_layers = plan.gpu_layers, plan.total_layers
        self._draft_failed = None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        if backends.weights_stay_unrepacked():
            mparams.use_extra_bufts = False
            log.info(
                "this CPU has AMX: %s keeps its weights unrepacked (llama.cpp's AMX path crashes)", entry.path.name
            )
        report = self._on_load_progress
        if report is not None:  # llama.cpp calls it while it reads the weights; True: go on loading

            def progress(share: float, _user: Any) -> bool:
                try:
                    report(float(share))
                except Exception:  # a failing report must not fail the load
                    log.debug("load progress report failed", exc_info=True)
                return True

            callback = llama_cpp.llama_progress_callback(progress)
            mparams.progress_callback = callback
        model = llama_cpp.llama_model_load_from_file(os.fsencode(entry.path), mparams)
        if not model:
            raise ModelLoadFailed(self._explain(runtime, mark, f"llama.cpp could not load {entry.path.name}"))
        self._model = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_swa = max(0, llama_cpp.llama_model_n_swa(model))  # 0: no sliding-window layers
        if not self.embeddings:
            # Finding the special tokens walks the whole vocabulary (~0.1 s for Gemma 3's 262k tokens):
            # done on a thread while llama.cpp makes the context, so no first request shares the CPU with it.
            self._prompt_tokenizer_thread = threading.Thread(
                target=self._prepare_prompt_tokenizer, name=f"lmsp-tokenizer-{self.id}", daemon=True
            )
            self._prompt_tokenizer_thread.start()
        self.context_length = plan.context_length
        trained = llama_cpp.llama_model_n_ctx_train(model)
        if trained > 0:
            self.context_length = max(16, min(self.context_length, trained))
        threads = plan.threads
        self.parallel = plan.parallel

        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = self.context_length * self.parallel
        cparams.n_seq_max = self.parallel
        cparams.n_batch = options.batch_size
        cparams.n_ubatch = options.batch_size
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = False
        cparams.swa_full = False  # sliding-window layers keep their window only (`swa`)
        cparams.no_perf = True
        if self.embeddings:
            # Each input is one sequence, whole in one micro-batch (an encoder needs that); up to
            # EMBED_SEQUENCES of them share a decode, in one KV space when the model has one at all.
            tokens = max(self.context_length, options.batch_size)
            cparams.embeddings = True
            cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = tokens
            cparams.n_seq_max = EMBED_SEQUENCES
            cparams.kv_unified = True
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise ModelLoadFailed(
                self._explain(runtime, mark, f"llama.cpp could not create a context of {cparams.n_ctx} tokens")
            )
        self._ctx = ctx
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.context_per_sequence = llama_cpp.llama_n_ctx_seq(ctx) or self.context_length
        if self.embeddings:
            self.context_per_sequence = min(self.context_per_sequence, cparams.n_ubatch)
        self.context_length = min(self.context_length, self.context_per_sequence)

        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._texts: dict[str, int] | None = None  # marker-like token texts, built on first use
        self._longest_piece: int | None = None
        self._piece_buf = ctypes.create_string_buffer(256)
        self.bos_text = self._token_text(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos_text = self._token_text(llama_cpp.llama_vocab_eos(self.vocab))
        self.template = self._template(entry)
        gpus = runtime.devices.gpus
        self.placement = Placement(
            device="gpu" if gpu_layers > 0 else "cpu",
            gpu_layers=min(gpu_layers, total_layers),
            total_layers=total_layers,
            threads=threads,
            description=(
                f"GPU ({gpus[0].description or gpus[0].name}), {min(gpu_layers, total_layers)}/{total_layers} layers"
                if gpu_layers > 0 and gpus
                else f"CPU, {threads} threads"
            ),
        )
        if self.embeddings:
            self.embedder = Embedder(
                self,
                max_sequences=EMBED_SEQUENCES,
                batch_tokens=cparams.n_ubatch,
                max_queue=options.max_queue,
                on_step=self._on_step,
            )
            return
        # A recurrent model's state cannot take back rejected draft tokens, nor be cut to a prefix.
        recurrent = llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
        if options.prompt_cache_dir and options.prompt_cache_bytes > 0 and not recurrent:
            self.prompt_cache = self._prompt_cache(entry, options, cparams, gpu_layers)
        self.vision = self._vision(entry, threads, gpu_layers > 0)
        speculative = options.speculative and not recurrent
        if speculative:
            self.draft_model = self._draft(plan, options, use_extra_bufts=bool(mparams.use_extra_bufts))
        self.scheduler = Scheduler(
            self,
            parallel=self.parallel,
            context_per_sequence=self.context_per_sequence,
            batch_size=options.batch_size,
            max_queue=options.max_queue,
            speculative=speculative,
            prompt_cache=self.prompt_cache,
            on_step=self._on_step,
            warm_up=None if llama_cpp.llama_model_has_encoder(model) else max(llama_cpp.llama_vocab_bos(self.vocab), 0),
            vision=self.vision,
            draft_model=self.draft_model,
            # an explicit `threads` is kept as given; the planned count yields to busy desktops
            threads=YieldingThreads(plan.threads) if options.threads is None else None,
        )
        self._grammars = GrammarBuilder(self.id, self.vocab, self.scheduler, on_done=self._on_step)

    def _vision(self, entry: ModelEntry, threads: int, gpu: bool) -> Vision | None:
        """The model's projector loaded with libmtmd, or None (no projector, or one that does not load:
        the model then takes text only, and says why in the log and in its plan: `projector_skipped`)."""
        projector = entry.projector
        self._projector_failed = None
        if projector is None or not (projector.vision or projector.audio) or self._model is None:
            return None
        if self.plan.projector_skipped:  # the service planned it out: it did not fit in memory
            log.warning("%s: text only: %s", self.id, self.plan.projector_skipped)
            return None
        try:
            return Vision(projector.path, self._model, threads=threads, gpu=gpu)
        except RuntimeError as exc:
            kind = "vision" if projector.vision else "audio"
            self._projector_failed = f"its {kind} projector did not load ({exc}), so it takes text only"
            log.warning("%s: %s", self.id, self._projector_failed)
            return None

    def _draft(self, plan: LoadPlan, options: LoadOptions, *, use_extra_bufts: bool) -> DraftModel | None:
        """The planned draft model, loaded beside this one with the same threads and device, one sequence
        per slot; None (the model runs without it, saying why: the log, `plan.draft_skipped`) when there
        is none or it cannot serve (another vocabulary, a file llama.cpp cannot load)."""
        if not plan.draft_path or plan.draft_skipped:
            return None
        try:
            draft = DraftModel(
                Path(plan.draft_path),
                self.vocab,
                parallel=self.parallel,
                context_per_sequence=self.context_per_sequence,
                batch_size=options.batch_size,
                threads=plan.threads,
                gpu_layers=-1 if plan.gpu_layers > 0 else 0,
                use_extra_bufts=use_extra_bufts,
            )
        except DraftRefused as exc:
            self._draft_failed = f"the draft model '{plan.draft_id}' was not used: {exc.reason}"
            log.warning("%s: %s", self.id, self._draft_failed)
            return None
        log.info("%s: drafts with '%s' where prompt lookup proposes nothing", self.id, plan.draft_id)
        return draft

    def _prompt_cache(
        self, entry: ModelEntry, options: LoadOptions, cparams: Any, gpu_layers: int
    ) -> PromptCache | None:
        assert options.prompt_cache_dir is not None
        try:
            return kv_states.open_cache(
                Path(options.prompt_cache_dir),
                entry.path,
                options.prompt_cache_bytes,
                context_per_sequence=self.context_per_sequence,
                cparams=cparams,
                gpu_layers=gpu_layers,
            )
        except OSError as exc:
            log.warning("%s: no prompt cache (%s)", self.id, exc)
            return None

    # -- vocabulary and template ----------------------------------------------------------------
    def _explain(self, runtime: Runtime, mark: int, headline: str) -> str:
        lines = [ln for ln in runtime.messages_since(mark) if ln]
        reason = lines[-1] if lines else "no reason given"
        return f"{headline}: {reason}"

    def _token_text(self, token: int) -> str:
        if token < 0 or token >= self.n_vocab:
            return ""
        raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def _template(self, entry: ModelEntry) -> ChatTemplate:
        source = entry.info.chat_template if entry.info else None
        if source:
            try:
                return ChatTemplate(source, "model", self.bos_text, self.eos_text, model_id=self.id)
            except ValueError as exc:
                log.warning("%s: own chat template unusable (%s); using a built-in one", self.id, exc)
        name = builtin_template_name(entry.info.architecture if entry.info else None, self.has_token)
        return ChatTemplate(BUILTIN_TEMPLATES[name], name, self.bos_text, self.eos_text, model_id=self.id)

    def has_token(self, text: str) -> bool:
        """True when `text` is a single special token of this vocabulary."""
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return len(tokens) == 1 and bool(
            llama_cpp.llama_vocab_get_attr(self.vocab, tokens[0]) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        )

    def find_token(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text` (a marker such as `<tool_call>`), if any."""
        if not text:
            return None
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        if len(tokens) == 1 and self._token_text(tokens[0]) == text:
            return tokens[0]
        texts = self._texts
        if texts is None:  # normal tokens are not split out by tokenization: look them up
            texts = {}
            for token in range(self.n_vocab):
                raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
                if raw and raw.startswith((b"<", b"[", b"\xe2\x97")) and len(raw) <= 32:
                    texts.setdefault(raw.decode("utf-8", errors="replace"), token)
            self._texts = texts
        return texts.get(text)

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_get_attr(self.vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raw = text.encode("utf-8")
        size = len(raw) + 8
        buf = (llama_cpp.llama_token * size)()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, size, add_special, parse_special)
        if n < 0:
            size = -n
            buf = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, size, add_special, parse_special)
        return list(buf[:n])

    def tokenize_prompt(self, text: str, *, at_most: int | None = None) -> list[int]:
        """A rendered prompt's tokens, start tokens included: what `tokenize(text)` gives, but a long
        prompt's pieces already seen (the earlier turns of a conversation) are not tokenized again.

        With `at_most`, a text that cannot fit in that many tokens (no token covers more than the
        vocabulary's longest piece) is refused at once, without tokenizing it: a 7 MiB input meant
        for an 8k window costs microseconds, not seconds of llama.cpp's tokenizer."""
        if at_most is not None and len(text) > max(SHORTCUT_FROM_CHARS, at_most):
            least = -(-len(text.encode("utf-8", errors="replace")) // self.longest_piece())
            if least > at_most:
                raise ContextLengthExceeded(
                    f"The input is at least {least:,} tokens; '{self.id}' has a context window of "
                    f"{self.context_length:,} tokens. Shorten the input.",
                    param="input",
                )
        vision = self.vision
        if vision is not None and IMAGE_MARKER in text:  # IMAGE_SLOT where each image goes
            first, *rest = text.split(IMAGE_MARKER)
            tokens = self._prompt_tokens(first)
            for piece in rest:
                tokens.append(IMAGE_SLOT)
                tokens.extend(self.tokenize(piece, add_special=False))
            return tokens
        return self._prompt_tokens(text)

    def _prompt_tokens(self, text: str) -> list[int]:
        tokenizer = self._prompt_tokenizer
        if tokenizer is None:  # still being built, off this thread
            return self.tokenize(text)
        return tokenizer.tokens(text) if tokenizer.markers else self.tokenize(text)

    def fim_tokens(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt, prefix-suffix-middle order as llama-server builds it: start token
        (if the model adds one), FIM prefix token, the prefix, FIM suffix token, the suffix, FIM middle
        token. The FIM tokens are the GGUF's `tokenizer.ggml.fim_*_token_id`, or the tokens llama.cpp
        recognises by their text (`<|fim_prefix|>`, `<fim_prefix>`, `▁<PRE>`, `<｜fim▁begin｜>`…). The
        texts are user text: special-token text inside them is not parsed as a token."""
        pre = llama_cpp.llama_vocab_fim_pre(self.vocab)
        suf = llama_cpp.llama_vocab_fim_suf(self.vocab)
        mid = llama_cpp.llama_vocab_fim_mid(self.vocab)
        if min(pre, suf, mid) < 0:
            raise UnsupportedCapability(
                f"'{self.id}' has no fill-in-the-middle tokens, so it cannot complete with a 'suffix'; "
                f"use a code model trained for it (its GGUF names FIM prefix, suffix and middle tokens).",
                param="suffix",
            )
        start = self.tokenize("", add_special=True, parse_special=False)  # the start token, if any
        body = self.tokenize(prefix, add_special=False, parse_special=False) if prefix else []
        tail = self.tokenize(suffix, add_special=False, parse_special=False) if suffix else []
        return [*start, pre, *body, suf, *tail, mid]

    def longest_piece(self) -> int:
        """The most bytes of text one token can stand for (its piece, or its text when it is special),
        and the space a tokenizer may put in front.

        Read from the file's vocabulary, the longest token text (~0.1 s for 262,144 tokens): llama.cpp
        makes a token's piece from its text by unescaping (SentencePiece's "▁" to a space, byte-level
        BPE's characters to their bytes, "<0x0A>" to its byte), never longer than the text. Asking
        llama.cpp for each token (`llama_longest_piece`) gives the same figure in 0.6-1.1 s of this
        process's interpreter lock, at the first long prompt, while its streams decode."""
        if self._longest_piece is None:
            try:
                lengths = token_text_lengths(self.entry.path)
            except GGUFError:
                lengths = None
            if lengths is not None and len(lengths) == self.n_vocab:
                self._longest_piece = max(lengths, default=0) + 1
            else:
                self._longest_piece = llama_longest_piece(self.vocab, self.n_vocab)
        return self._longest_piece

    def prompt_tokenizer(self) -> PromptTokenizer:
        """The model's piece tokenizer, built on first use."""
        with self._prompt_tokenizer_lock:
            if self._prompt_tokenizer is not None:
                return self._prompt_tokenizer

            def piece(text: str) -> list[int]:
                return self.tokenize(text, add_special=False)

            start = self.tokenize("", add_special=True)
            tokenizer = PromptTokenizer(piece, [], start=start)
            try:
                probe = "Hello world.\n Hello"
                composable = self.tokenize(probe) == start + piece(probe)  # no end-of-text token appended
                split = self._split if self._split is not None else self._split_tokens()
                markers = turn_markers(split, self.template.source) if composable else []
                cache = max(1 << 16, 4 * self.context_length * self.parallel)
                pieced = PromptTokenizer(piece, markers, start=start, max_cached_tokens=cache)
                sample = self._sample_prompt()
                if markers and sample and pieced.tokens(sample) != self.tokenize(sample):
                    log.warning("%s: prompts cut before %s tokenize differently; tokenizing whole", self.id, markers)
                elif markers:
                    tokenizer = pieced
                    log.info("%s: long prompts are tokenized in pieces cut before %s", self.id, markers)
            except Exception:  # never worse than whole-prompt tokenization
                log.exception("%s: could not set up piecewise tokenization", self.id)
            self._prompt_tokenizer = tokenizer
            return tokenizer

    def _prepare_prompt_tokenizer(self) -> None:
        """At load, on its own thread: the special tokens at once, the piece tokenizer once loaded."""
        try:
            self._split = self._split_tokens()
        except Exception:  # the piece tokenizer tries again, or tokenizes whole
            log.exception("%s: could not list the special tokens", self.id)
        self._loaded.wait()
        if self.scheduler is not None and self._ctx is not None:
            self.prompt_tokenizer()

    def _split_tokens(self) -> list[SpecialToken]:
        """The tokens llama.cpp splits out of text before tokenizing it."""
        get_attr = llama_cpp.llama_vocab_get_attr
        vocab = self.vocab
        return [
            SpecialToken(
                self._token_text(token),
                control=bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL),
                lstrip=bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
            )
            for token in range(self.n_vocab)
            if (attr := get_attr(vocab, token)) & _SPLIT_ATTRS
        ]

    def _sample_prompt(self) -> str:
        turns = [("user", " Hi,\n\n  there "), ("assistant", "Hello!\n"), ("user", "\tAnd  then?")]
        try:
            return self.template.render([{"role": r, "content": c} for r, c in turns])
        except Exception:  # noqa: BLE001 - a template with rules of its own: no sample to check against
            return ""

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (control tokens render as nothing unless `special`)."""
        if special:
            n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, True)
            return self._piece_buf.raw[:n] if n > 0 else b""
        cached = self._pieces[token]
        if cached is None:
            n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, False)
            cached = self._piece_buf.raw[:n] if n > 0 else b""
            self._pieces[token] = cached
        return cached

    def token_pieces(self, tokens: Sequence[int]) -> list[dict[str, Any]]:
        """Each token with its text, as llama-server's `/tokenize` `with_pieces` gives it: a string when
        the token's bytes are UTF-8 on their own, else the bytes as numbers."""
        out: list[dict[str, Any]] = []
        for token in self._known(tokens):
            raw = self.piece(token, special=True)
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            out.append({"id": token, "piece": piece})
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`, special tokens written out (as llama-server's `/detokenize`)."""
        return b"".join(self.piece(t, special=True) for t in self._known(tokens)).decode("utf-8", errors="replace")

    def _known(self, tokens: Sequence[int]) -> list[int]:
        bad = next((t for t in tokens if not 0 <= int(t) < self.n_vocab), None)
        if bad is not None:
            raise InvalidRequest(
                f"The token {bad} is outside this model's vocabulary (0-{self.n_vocab - 1}).", param="tokens"
            )
        return [int(t) for t in tokens]

    def is_eog(self, token: int) -> bool:
        return llama_cpp.llama_vocab_is_eog(self.vocab, token)

    def render(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> str:
        return self.template.render(messages, **kwargs)

    @property
    def llama_model(self) -> llama_cpp.llama_model_p:
        if self._model is None:
            raise RuntimeError("the model is closed")
        return self._model

    # -- embeddings -----------------------------------------------------------------------------
    def embedding_inputs(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Each input as tokens (a text with the model's start and end tokens), checked against the
        window before anything is decoded: llama.cpp aborts on an input longer than its batch."""
        window = self.context_length
        out: list[list[int]] = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                raw = item.encode("utf-8", errors="replace")
                if len(raw) > max(SHORTCUT_FROM_CHARS, window):
                    least = -(-len(raw) // self.longest_piece())
                    if least > window:
                        raise InputTooLong(
                            f"Input {i} is at least {least:,} tokens; '{self.id}' embeds at most {window:,} "
                            f"tokens per input. Shorten it or split it into several inputs.",
                            param=f"input[{i}]",
                        )
                tokens = self.tokenize(item, add_special=True, parse_special=False)
            else:
                tokens = [int(t) for t in item]
                bad = next((t for t in tokens if not 0 <= t < self.n_vocab), None)
                if bad is not None:
                    raise InvalidRequest(
                        f"Input {i} holds the token {bad}, outside this model's vocabulary (0-{self.n_vocab - 1}).",
                        param=f"input[{i}]",
                    )
            if not tokens:
                raise InvalidRequest(f"Input {i} is empty.", param=f"input[{i}]")
            if len(tokens) > window:
                raise InputTooLong(
                    f"Input {i} is {len(tokens):,} tokens; '{self.id}' embeds at most {window:,} tokens per "
                    f"input. Shorten it or split it into several inputs.",
                    param=f"input[{i}]",
                )
            out.append(tokens)
        return out

    def rerank_inputs(self, pairs: Sequence[Sequence[str]]) -> list[list[int]]:
        """Each (query, document) pair as the tokens llama-server's `--reranking` scores: the GGUF's
        `rerank` template with both filled in when it has one (Qwen3-Reranker), else start token,
        query, end/separator tokens as the vocabulary adds them, document (bge-reranker, jina)."""
        template = llama_cpp.llama_model_chat_template(self.llama_model, b"rerank")
        vocab = self.vocab
        eos = llama_cpp.llama_vocab_eos(vocab)
        if eos == llama_cpp.LLAMA_TOKEN_NULL:
            eos = llama_cpp.llama_vocab_sep(vocab)
        window = self.context_length
        out: list[list[int]] = []
        for i, (query, document) in enumerate(pairs):
            if template:
                text = template.decode("utf-8").replace("{query}", query).replace("{document}", document)
                tokens = self.tokenize(text, add_special=False, parse_special=True)
            else:
                tokens = []
                if llama_cpp.llama_vocab_get_add_bos(vocab):
                    tokens.append(llama_cpp.llama_vocab_bos(vocab))
                tokens += self.tokenize(query, add_special=False, parse_special=False)
                if llama_cpp.llama_vocab_get_add_eos(vocab):
                    tokens.append(eos)
                if llama_cpp.llama_vocab_get_add_sep(vocab):
                    tokens.append(llama_cpp.llama_vocab_sep(vocab))
                tokens += self.tokenize(document, add_special=False, parse_special=False)
                if llama_cpp.llama_vocab_get_add_eos(vocab):
                    tokens.append(eos)
            if len(tokens) > window:
                raise InputTooLong(
                    f"The query and document {i} are {len(tokens):,} tokens together; '{self.id}' scores at most "
                    f"{window:,} tokens per document. Shorten them.",
                    param=f"documents[{i}]",
                )
            out.append(tokens)
        return out

    def embed_async(
        self,
        inputs: Sequence[str | Sequence[int]],
        done: EmbedDone,
        *,
        cancel: EmbedCancel | None = None,
        pairs: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """Tokenize and check `inputs` here (raising a typed error), then queue them; `done` gets the
        vectors (or the error, `RequestCancelled` after `cancel.cancel()`) on the embedder's thread.
        A reranker takes (query, document) `pairs` instead, and its "vectors" are the scores."""
        embedder = self.embedder
        if embedder is None or self.reranker != (pairs is not None):
            what = "a reranker" if pairs is not None else "an embedding model"
            raise UnsupportedCapability(f"'{self.id}' is not {what}.", param="model")
        tokens = self.rerank_inputs(pairs) if pairs is not None else self.embedding_inputs(inputs)
        embedder.submit(EmbedJob(tokens, done), cancel)

    def embed(
        self,
        inputs: Sequence[str | Sequence[int]],
        *,
        cancel: EmbedCancel | None = None,
        pairs: Sequence[Sequence[str]] | None = None,
    ) -> Embeddings:
        """`embed_async`, waiting for the answer."""
        answer: list[Embeddings | LMSPError] = []
        ready = threading.Event()

        def done(result: Embeddings | LMSPError) -> None:
            answer.append(result)
            ready.set()

        self.embed_async(inputs, done, cancel=cancel, pairs=pairs)
        ready.wait()
        if isinstance(answer[0], LMSPError):
            raise answer[0]
        return answer[0]

    def rerank(self, pairs: Sequence[tuple[str, str]], *, cancel: EmbedCancel | None = None) -> Embeddings:
        """A reranker's classifier output for each (query, document) pair (column 0: the score)."""
        return self.embed([], cancel=cancel, pairs=pairs)

    def measure(self, prompt: Sequence[int], media: Sequence[ImagePixels | AudioClip]) -> int:
        """`prompt`'s length with its media's tokens in place (libmtmd preprocesses them; nothing is encoded)."""
        if not media and IMAGE_SLOT not in prompt:
            return len(prompt)
        if self.vision is None:
            raise UnsupportedCapability(f"'{self.id}' does not take images or audio.", param="input")
        return len(self.vision.expand(prompt, media).prompt)

    # -- generation -----------------------------------------------------------------------------
    def submit(self, job: GenerationJob) -> None:
        if self.embedder is not None:
            raise UnsupportedCapability(f"'{self.id}' is an embedding model: it does not generate text.", param="model")
        scheduler = self.scheduler
        if scheduler is None or self._grammars is None:
            raise RuntimeError("the model is closed")
        if job.images or IMAGE_SLOT in job.prompt:
            if self.vision is None:
                raise UnsupportedCapability(f"'{self.id}' does not take images or audio.", param="input")
            if IMAGE_SLOT in job.prompt[: job.stable_prefix]:
                job.stable_prefix = 0  # an image inside the fixed prefix moves its end: no checkpoint there
            expanded = self.vision.expand(job.prompt, job.images)
            if len(expanded.prompt) >= self.context_length:
                raise ContextLengthExceeded(
                    f"The input is {len(expanded.prompt)} tokens with its images; '{self.id}' has a context "
                    f"window of {self.context_length} tokens. Send fewer images or shorten the input.",
                    param="input",
                )
            job.prompt, job.media, job.images = expanded.prompt, expanded.images, ()
        if job.sampling.grammar:  # compiled off the decoding thread, then queued
            scheduler.check_admission()
            self._grammars.submit(job)
        else:
            scheduler.submit(job)

    @property
    def busy(self) -> bool:
        if self.embedder is not None:
            return self.embedder.busy
        scheduler = self.scheduler
        pending = self._grammars.pending if self._grammars is not None else 0
        return pending > 0 or (scheduler is not None and scheduler.busy)

    @property
    def last_activity(self) -> float:
        if self.embedder is not None:
            return self.embedder.last_activity
        scheduler = self.scheduler
        return scheduler.last_activity if scheduler is not None else self.loaded_monotonic

    def stats(self, *, batches: bool = False) -> ModelStats:
        embedder = self.embedder
        if embedder is not None:
            return ModelStats(
                steps=embedder.steps,
                queued=embedder.queued,
                batch_sizes=tuple(embedder.sequences) if batches else (),  # inputs per decode
                cancelled=embedder.cancelled_jobs,
                pid=os.getpid(),
            )
        scheduler = self.scheduler
        if scheduler is None:
            return ModelStats(pid=os.getpid())
        pending = self._grammars.pending if self._grammars is not None else 0
        return ModelStats(
            steps=scheduler.steps,
            queued=scheduler.queued + pending,
            generating=scheduler.generating,
            batch_sizes=tuple(scheduler.batch_sizes) if batches else (),
            pid=os.getpid(),
            drafted=scheduler.drafted,
            accepted=scheduler.accepted,
            model_drafted=scheduler.model_drafted,
            model_accepted=scheduler.model_accepted,
        )

    @property
    def ctx(self) -> llama_cpp.llama_context_p:
        if self._ctx is None:
            raise RuntimeError("the model is closed")
        return self._ctx

    def close(self, *, drain: bool = False) -> None:
        """Stop the scheduler (letting running work finish with `drain`) and free memory."""
        self._loaded.set()
        if self._prompt_tokenizer_thread is not None:
            self._prompt_tokenizer_thread.join()  # it reads the vocabulary freed below
        if self.embedder is not None:
            self.embedder.stop(drain=drain)
            self.embedder.close()
            self.embedder = None
        if self.scheduler is not None:
            if drain and self._grammars is not None:
                self._grammars.close()  # its jobs reach the scheduler, which then drains them
                self._grammars = None
            self.scheduler.stop(drain=drain)
            if self._grammars is not None:
                self._grammars.close()  # anything still being compiled ends 503 (the scheduler stopped)
                self._grammars = None
            if self.prompt_cache is not None and self._ctx:
                try:  # the scheduler's thread has stopped: the context is this thread's now
                    self.scheduler.save_states()
                except Exception:
                    log.exception("%s: could not save the prompt cache", self.id)
                self.prompt_cache.close()  # the writes finish before the context (and process) go
            if self.draft_model is not None and self.scheduler.model_drafted:
                log.info(
                    "%s: the draft model's guesses: %d of %d kept (%.0f%%)",
                    self.id,
                    self.scheduler.model_accepted,
                    self.scheduler.model_drafted,
                    100 * self.scheduler.model_accepted / self.scheduler.model_drafted,
                )
            self.scheduler.close()
            self.scheduler = None
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        free_handles(self._ctx, self._model)
        self._ctx = self._model = None
