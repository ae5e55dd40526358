"""The model process: one loaded model, driven by the service over its stdin and stdout.

Why a process per model: llama.cpp maps the weights from the model file, so a
file truncated or overwritten while it is loaded (a re-download, `ollama
pull`, a sync tool) ends the process that maps it with SIGBUS; llama.cpp also
aborts the process on some inputs (`GGML_ASSERT`), and the system kills a
process that runs out of memory. In here, any of these ends one model; the
service, the tray and every other model keep running (`process.ModelProcess`
is the service's side of this).

Started as `python -m lmsp_tray.runner.worker` (`engine.launch`; the frozen
program: its own executable with a flag). The first frame says what to load (`wire.LOAD`,
the `LoadPlan` the service checked against its memory budget, so GPU layers
and context are exactly as planned); the answer is `READY` with the facts the
service needs (window, placement, template) or `FAILED`. Then jobs, cancels,
tokenize requests and calls come in on stdin and deltas, finishes and
replies go out on stdout, which nothing else may write to: C code writing
to file descriptor 1 lands on stderr instead, which the service reads for
llama.cpp's last words. The process ignores SIGINT and SIGTERM (the service
decides when it ends) and exits when its stdin closes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import signal
import struct
import sys
import threading
from typing import Any

from lmsp_tray.engine import embedding, launch, wire
from lmsp_tray.engine.embedding import EmbedCancel, Embeddings
from lmsp_tray.engine.jobs import ERROR, Finish, GenerationJob, GrammarOn, TokenLogprob
from lmsp_tray.engine.load_plan import LoadOptions, LoadPlan
from lmsp_tray.engine.trigger import CallMarkers
from lmsp_tray.errors import InternalError, LMSPError, ModelLoadFailed

EXIT_SAVE_S = 20.0  # after the service vanished, this long to save sequence states before exiting
log = logging.getLogger("lmsp_tray.runner.worker")


class Worker:
    """The loaded model and the jobs the service sent it."""

    def __init__(self, writer: wire.FrameWriter) -> None:
        self._writer = writer
        self._jobs: dict[int, GenerationJob] = {}
        self._embeds: dict[int, EmbedCancel] = {}  # EMBED requests not answered yet (a CANCEL stops one)
        self._lock = threading.Lock()
        self._calls = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="lmsp-worker-call")
        self.model: Any = None  # runner.model.LlamaModel once loaded
        self._closing = False
        self._runtime: Any = None

    # -- loading --------------------------------------------------------------------------------
    def load(self, spec: dict[str, Any]) -> dict[str, Any]:
        from lmsp_tray.runner.model import LlamaModel  # llama.cpp is loaded here, in the model process
        from lmsp_tray.runner.runtime import Runtime

        self._runtime = Runtime()
        entry = launch.entry_from_spec(spec["entry"])
        options = LoadOptions(**spec["options"])
        plan = LoadPlan(**spec["plan"])
        sent = [-1]

        def loading(share: float) -> None:  # whole percents only: a few dozen frames at most
            percent = int(share * 100)
            if percent > sent[0]:
                sent[0] = percent
                self._writer.send(wire.frame(wire.LOADING, 0, wire.LOAD_PROGRESS.pack(share)))

        self.model = model = LlamaModel(
            self._runtime, entry, options, plan, on_step=self._writer.flush, on_load_progress=loading
        )
        template = model.template
        return {
            "context_length": model.context_length,
            "parallel": model.parallel,
            "placement": dataclasses.asdict(model.placement),
            "load_seconds": model.load_seconds,
            "template": {
                "source": template.source,
                "name": template.name,
                "bos_token": template.bos_token,
                "eos_token": template.eos_token,
            },
            "pid": os.getpid(),
            "embeddings": model.embedder is not None,
            "sliding_window": model.n_swa > 0,  # a stable prefix is worth finding (a checkpoint goes there)
            "vision": model.vision is not None and model.vision.images,
            "audio": model.vision is not None and model.vision.audio,
            "projector_skipped": model.plan.projector_skipped,  # why it takes text only although it has a projector
            "draft_skipped": model.plan.draft_skipped,  # why it runs without the draft model it names
        }

    # -- frames from the service ----------------------------------------------------------------
    def handle(self, kind: int, ident: int, payload: bytes) -> None:
        if kind == wire.SUBMIT:
            self._submit(ident, payload)
        elif kind == wire.CANCEL:
            with self._lock:
                job = self._jobs.get(ident)
                embed = self._embeds.get(ident)
            if job is not None:
                job.cancel()
            if embed is not None:
                embed.cancel()
        elif kind == wire.TOKENIZE:
            self._calls.submit(self._tokenize, ident, payload)
        elif kind == wire.MEASURE:
            self._calls.submit(self._measure, ident, payload)
        elif kind == wire.CALL:
            self._calls.submit(self._call, ident, payload)
        elif kind == wire.EMBED:
            cancel = EmbedCancel()  # in place now: a CANCEL read before the call thread starts still counts
            with self._lock:
                self._embeds[ident] = cancel
            self._calls.submit(self._embed, ident, payload, cancel)
        elif kind == wire.CLOSE:
            threading.Thread(target=self._close, args=(payload == b"1",), name="lmsp-worker-close").start()
        else:
            log.warning("unknown frame kind %s", kind)

    def _submit(self, ident: int, payload: bytes) -> None:
        spec, prompt, images = wire.unpack_job(payload)
        lazy = spec.get("lazy")
        job = GenerationJob(
            prompt=prompt,
            sampling=wire.sampling_from_json(spec["sampling"]),
            max_tokens=int(spec["max_tokens"]),
            sink=self._sink(ident),
            stop=tuple(spec.get("stop") or ()),
            stop_tokens=frozenset(spec.get("stop_tokens") or ()),
            grammar_trigger=CallMarkers.from_json(lazy) if lazy else None,
            visible_tokens=frozenset(spec.get("visible_tokens") or ()),
            logprobs=spec.get("logprobs"),
            stable_prefix=int(spec.get("stable_prefix") or 0),
            images=images,
        )
        with self._lock:
            self._jobs[ident] = job
        try:
            self.model.submit(job)
        except LMSPError as exc:
            job.sink(Finish(ERROR, len(prompt), 0, error=exc))
            self._writer.flush()

    def _sink(self, ident: int) -> Any:
        queue = self._writer.queue  # sent with the rest of the decode step (FrameWriter.flush)

        def sink(item: str | GrammarOn | TokenLogprob | Finish) -> None:
            if isinstance(item, str):
                queue(wire.frame(wire.TEXT, ident, item.encode("utf-8", errors="replace")))
            elif isinstance(item, TokenLogprob):
                queue(wire.frame(wire.LOGPROB, ident, wire.pack_logprob(item)))
            elif isinstance(item, GrammarOn):
                queue(wire.frame(wire.GRAMMAR_ON, ident, item.root.encode("utf-8")))
            else:
                with self._lock:
                    self._jobs.pop(ident, None)
                queue(wire.frame(wire.FINISH, ident, wire.pack_finish(item)))

        return sink

    def _tokenize(self, ident: int, payload: bytes) -> None:
        try:
            (at_most,) = struct.unpack_from("<I", payload)
            text = payload[4:].decode("utf-8", errors="replace")
            tokens = self.model.tokenize_prompt(text, at_most=at_most or None)
            self._writer.send(wire.frame(wire.TOKENS, ident, wire.pack_tokens(tokens)))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, not raised here
            self._reply_error(ident, exc)

    def _measure(self, ident: int, payload: bytes) -> None:
        try:
            _, prompt, media = wire.unpack_job(payload)
            self._writer.send(wire.frame(wire.TOKENS, ident, wire.pack_tokens([self.model.measure(prompt, media)])))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, not raised here
            self._reply_error(ident, exc)

    def _call(self, ident: int, payload: bytes) -> None:
        try:
            request = wire.unpack_json(payload)
            op = request.get("op")
            result: Any
            if op == "find_token":
                result = self.model.find_token(str(request["text"]))
            elif op == "is_control":
                result = self.model.is_control(int(request["token"]))
            elif op == "longest_piece":
                result = self.model.longest_piece()
            elif op == "fim_tokens":
                result = self.model.fim_tokens(str(request["prefix"]), str(request["suffix"]))
            elif op == "tokenize":
                result = self.model.tokenize(
                    str(request["text"]),
                    add_special=bool(request.get("add_special")),
                    parse_special=bool(request.get("parse_special", True)),
                )
                if request.get("with_pieces"):
                    result = self.model.token_pieces(result)
            elif op == "detokenize":
                result = self.model.detokenize([int(t) for t in request["tokens"]])
            elif op == "stats":
                result = dataclasses.asdict(self.model.stats(batches=bool(request.get("batches"))))
            else:
                raise ValueError(f"unknown call {op!r}")
            self._writer.send(wire.frame(wire.REPLY, ident, wire.pack_json(result)))
        except Exception as exc:  # noqa: BLE001
            self._reply_error(ident, exc)

    def _embed(self, ident: int, payload: bytes, cancel: EmbedCancel) -> None:
        """Tokenize and check the inputs on this call thread, then leave them to the embedder, whose
        thread sends the vectors back (or `RequestCancelled`, once a CANCEL for `ident` came)."""

        def done(result: Embeddings | LMSPError) -> None:
            with self._lock:
                self._embeds.pop(ident, None)
            if isinstance(result, LMSPError):
                self._reply_error(ident, result)
            else:
                self._writer.send(wire.frame(wire.EMBEDDINGS, ident, embedding.pack(result)))

        try:
            cancel.check()  # cancelled before this call thread began: not even tokenized
            request = wire.unpack_json(payload)
            pairs = request.get("pairs")
            self.model.embed_async(request.get("inputs") or [], done, cancel=cancel, pairs=pairs)
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._embeds.pop(ident, None)
            self._reply_error(ident, exc)

    def _reply_error(self, ident: int, exc: Exception) -> None:
        if not isinstance(exc, LMSPError):
            log.exception("a call to the model process failed")
            exc = InternalError(f"The model process could not answer ({type(exc).__name__}).")
        self._writer.send(wire.frame(wire.ERROR, ident, wire.pack_json(wire.pack_error(exc))))

    def _close(self, drain: bool) -> None:
        with self._lock:
            closing, self._closing = self._closing, True
        if closing:  # the first close ends the process
            threading.Event().wait()
        try:
            if self.model is not None:
                self.model.close(drain=drain)
            if self._runtime is not None:
                self._runtime.close()
        except Exception:
            log.exception("closing the model failed")
        finally:
            self._writer.flush()
            os._exit(0)


def _own_stdio() -> tuple[int, int]:
    """The protocol's file descriptors; fd 0 becomes /dev/null and fd 1 a copy of stderr."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return fd_in, fd_out


def _no_core_dumps() -> None:
    """A crashed model process must not write a core file the size of its model."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass


def main() -> int:
    fd_in, fd_out = _own_stdio()
    _no_core_dumps()
    for name in ("SIGINT", "SIGTERM"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    writer = wire.FrameWriter(fd_out)
    frames = wire.FrameReader(fd_in).frames()
    first = next(frames, None)
    if first is None or first[0] != wire.LOAD:
        return 2
    spec = wire.unpack_json(first[2])
    logging.basicConfig(
        stream=sys.stderr,
        level=int(spec.get("log_level") or logging.WARNING),
        format="%(levelname)s %(name)s: %(message)s",
    )
    worker = Worker(writer)
    try:
        facts = worker.load(spec)
    except LMSPError as exc:
        writer.send(wire.frame(wire.FAILED, 0, wire.pack_json(wire.pack_error(exc))))
        return 0
    except Exception as exc:  # noqa: BLE001 - reported as a failed load
        error = ModelLoadFailed(f"Could not load '{spec['entry']['id']}': {exc}")
        writer.send(wire.frame(wire.FAILED, 0, wire.pack_json(wire.pack_error(error))))
        return 0
    writer.send(wire.frame(wire.READY, 0, wire.pack_json(facts)))
    for kind, ident, payload in frames:
        worker.handle(kind, ident, payload)
    # The service is gone (or closed our stdin): nothing left to do for anyone but save what the
    # prompt cache can keep (bounded: a stuck close must not leave an orphan process behind).
    threading.Timer(EXIT_SAVE_S, os._exit, (0,)).start()
    worker._close(False)
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
