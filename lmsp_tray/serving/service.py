"""Requests to engine jobs to protocol events: the service, with no HTTP in it.

`Service.start_response` does everything that can fail *before* a response
starts (find and load the model, render and tokenize the conversation,
check the context window and the grammar's size, queue the job), so those
failures are plain problem documents; rendering (a template is a bounded
program from the model file) and tokenization (a call to the model process)
run in a worker thread, never on the event loop. The returned `ResponseRun`
then yields the response's events as the model produces them; after the
first event a failure — the model process crashing included — becomes a
terminal `response.failed` event, never an exception. Sync requests read
the same events and keep the final object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lmsp_tray import __version__
from lmsp_tray.auth.tokens import SCOPES
from lmsp_tray.chat.capabilities import fill_in_the_middle, model_capabilities
from lmsp_tray.chat.parser import OutputParser, ParserConfig, apply
from lmsp_tray.chat.plan import ChatPlan, OutputSpec, build_plan, prepare
from lmsp_tray.config import Config, ConfigError, parse_duration
from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.jobs import (
    CANCELLED,
    CONTEXT,
    ERROR,
    IMAGE_SLOT,
    LENGTH,
    AudioClip,
    Finish,
    GenerationJob,
    GrammarOn,
    ImagePixels,
    TokenLogprob,
)
from lmsp_tray.engine.loaded import LoadedModel
from lmsp_tray.engine.manager import DEFAULT, KeepAlive, ModelManager
from lmsp_tray.engine.sampling import (
    DEFAULT_MIN_P,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    SamplingParams,
)
from lmsp_tray.engine.templates import RenderedPast
from lmsp_tray.engine.trigger import CallMarkers
from lmsp_tray.errors import (
    ContextLengthExceeded,
    InputTooLong,
    InvalidRequest,
    LMSPError,
    ModelCrashed,
    ModelLoadFailed,
    ModelNotFound,
    ServiceUnavailable,
    UnsupportedCapability,
    quote,
)
from lmsp_tray.protocol.events import Event, ResponseAssembler
from lmsp_tray.protocol.images import IMAGE_MARKER, AudioInput, ImageInput, check_images
from lmsp_tray.protocol.requests import RawPrompt, ResponseRequest
from lmsp_tray.protocol.states import ModelState
from lmsp_tray.serving.aliases import resolve_model
from lmsp_tray.serving.hardware import backend_document, memory_by_device
from lmsp_tray.serving.images import decode_all
from lmsp_tray.serving.input_bounds import PROBE_CHARS_PER_TOKEN, probe_chars, text_floor, token_floor
from lmsp_tray.serving.model_settings import settings_document, with_model_defaults

log = logging.getLogger("lmsp_tray.serving.service")


class Catalog(Protocol):
    """What the service needs from discovery (implemented by `discovery.catalog.Catalog`)."""

    def entries(self) -> list[ModelEntry]: ...

    def resolve(self, name: str) -> ModelEntry | None: ...


@dataclass
class Capabilities:
    """Service-level capabilities advertised in `GET /lmsp/v1` (the daemon adds `conversations`
    when it runs with the store)."""

    names: tuple[str, ...] = ("streaming", "tools", "structured_output", "reasoning")


class ResponseRun:
    """One running response: its events, in order, then the final object."""

    def __init__(
        self,
        assembler: ResponseAssembler,
        job: GenerationJob,
        queue: asyncio.Queue,
        on_done: Callable[[ResponseRun], None] | None = None,
        parser: OutputParser | None = None,
    ) -> None:
        self.assembler = assembler
        self.job = job
        self._queue = queue
        self._parser = parser or OutputParser(ParserConfig())  # text -> reasoning / message / calls
        self._on_done = on_done
        self.error: LMSPError | None = None
        self.finish: Finish | None = None  # how generation ended (cached_tokens: prompt reused from KV cache)
        self._cancel_error: LMSPError | None = None
        self._logprobs: list[dict[str, Any]] = []  # of tokens whose text has not come through yet
        # For the activity view: when it started and first produced text, and the text pieces so far
        # (about one per token; the final count is `finish.output_tokens`).
        self.created = time.monotonic()
        self.first_output: float | None = None
        self.pieces = 0

    @property
    def response_id(self) -> str:
        return self.assembler.response_id

    def cancel(self, error: LMSPError | None = None) -> None:
        """Stop generating within one step; with `error` the response ends `failed` with it, not `cancelled`."""
        if error is not None and self._cancel_error is None and not self.assembler.finished:
            self._cancel_error = error
        self.job.cancel()

    async def events(self) -> AsyncIterator[Event]:
        """The response's events from `response.created` to its one terminal event."""
        asm = self.assembler
        try:
            for event in asm.start():
                yield event
            while True:
                item = await self._queue.get()
                if isinstance(item, str):
                    if self.first_output is None:
                        self.first_output = time.monotonic()
                    self.pieces += 1
                    for event in self._text(item):
                        yield event
                    continue
                if isinstance(item, TokenLogprob):
                    self._logprobs.append(_logprob_entry(item))
                    continue
                if isinstance(item, GrammarOn):
                    self._parser.grammar_on()
                    continue
                if item.reason != ERROR:
                    for event in apply(asm, self._parser.finish()):
                        yield event
                for event in self._terminal(item):
                    yield event
                return
        finally:
            if not asm.finished:
                self.job.cancel()  # consumer went away: stop generating within one step
            if self._on_done is not None:
                self._on_done(self)

    def _text(self, text: str) -> list[Event]:
        """The events of a text delta; a plain-text answer's deltas carry the log probabilities of the tokens
        behind them (asked for with `logprobs`; thinking and tool calls are parsed out of the text, so their
        tokens have none)."""
        ops = self._parser.feed(text)
        if not self._parser.passthrough or not self._logprobs:
            self._logprobs.clear()
            return apply(self.assembler, ops)
        taken, self._logprobs = self._logprobs, []
        events: list[Event] = []
        for kind, payload in ops:
            if kind == "text":
                events += self.assembler.text(payload, logprobs=taken)
                taken = []
        return events

    def _terminal(self, finish: Finish) -> list[Event]:
        asm = self.assembler
        self.finish = finish
        if finish.reason == ERROR:
            self.error = finish.error or ServiceUnavailable("Generation failed.")
            return asm.fail(self.error.to_problem())
        if finish.reason == CANCELLED:
            if self._cancel_error is not None:
                self.error = self._cancel_error
                return asm.fail(self.error.to_problem())
            return asm.cancel()
        cached = finish.cached_tokens
        if finish.reason in (LENGTH, CONTEXT):
            return asm.incomplete("max_output_tokens", finish.prompt_tokens, finish.output_tokens, cached_tokens=cached)
        return asm.complete(
            finish.prompt_tokens, finish.output_tokens, cached_tokens=cached, stop_sequence=finish.stop_sequence
        )

    async def result(self) -> dict[str, Any]:
        """Run to the end and return the response object; a failure raises its LMSP error."""
        async for _ in self.events():
            pass
        if self.error is not None:
            raise self.error
        return self.assembler.response()


class Removal(Protocol):
    def refusal(self, entry: ModelEntry) -> str | None: ...


class Service:
    def __init__(
        self, *, config: Config, catalog: Catalog, models: ModelManager, capabilities: Capabilities | None = None
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.models = models
        self.capabilities = capabilities or Capabilities()
        self.started_at = time.time()
        self._runs: set[ResponseRun] = set()
        self._run_listeners: list[Callable[[ResponseRun], None]] = []
        self._finished_output_tokens = 0
        self._closing = False  # shutting down: no new responses
        self.removal: Removal | None = None  # what may be deleted (the daemon's `ModelRemover`)

    # -- service document -----------------------------------------------------------------------
    def service_document(self) -> dict[str, Any]:
        return {
            "object": "service",
            "lmsp_version": "1.0",
            "versions": ["1.0"],
            "service": {"name": "lmsp-tray", "version": __version__},
            "capabilities": list(self.capabilities.names),
            "auth": {"type": "bearer", "scopes": list(SCOPES)},
            "limits": {
                "max_request_bytes": self.config.max_request_bytes,
                "event_retention_seconds": int(self.config.event_retention),
            },
            "extensions": {"lmsp_tray": backend_document(self.models.devices, self.config.gpu)},
        }

    # -- models ---------------------------------------------------------------------------------
    def entry(self, model_id: str, *, param: str | None = None) -> ModelEntry:
        entry = resolve_model(self.catalog.resolve, self.config.model_aliases, model_id)
        if entry is None:
            raise ModelNotFound(
                f"No model {quote(model_id)} is available. GET /lmsp/v1/models lists the models this service found.",
                param=param,
            )
        return entry

    def decoding(self) -> bool:
        """Whether a loaded model has work (a job waiting or generating): what background work steps aside for."""
        return any(model.busy for model in self.models.loaded())

    def model_object(self, entry: ModelEntry) -> dict[str, Any]:
        state, error = self.models.state(entry.id)
        loaded = self.models.get(entry.id)
        info = entry.info
        problem = None
        if entry.error:
            state = ModelState.ERROR
            problem = ModelLoadFailed(f"'{entry.id}' cannot be used: {entry.error}").to_problem()
        elif state == ModelState.ERROR and error is not None:
            problem = error.to_problem()
        obj: dict[str, Any] = {
            "id": entry.id,
            "object": "model",
            "architecture": info.architecture if info else None,
            "parameters": info.size_label if info else None,
            "quantization": info.quantization if info else None,
            "context_length": loaded.context_length if loaded else self.models.context_window(entry),
            "size_bytes": entry.size_bytes,
            "capabilities": self.model_capabilities(entry),
            "state": state,
            "source": entry.source,
            "error": problem,
        }
        ext: dict[str, Any] = {
            "path": str(entry.path),
            "file_name": entry.path.name,
            "fill_in_the_middle": fill_in_the_middle(entry),  # not an LMSP capability: see chat.capabilities
            "input_modalities": entry.input_modalities,  # "image" with a vision projector: not an LMSP capability
            "trained_context_length": info.context_length if info else None,  # the window's ceiling
        }
        if entry.projector is not None:
            ext["projector"] = {"file_name": entry.projector.path.name, "size_bytes": entry.projector.size_bytes}
        if entry.error:
            ext["file_error"] = entry.error  # the file itself cannot be used (not a failed load)
        if self.removal is not None:  # whether DELETE /models/{id} may remove it (the service's own file)
            ext["deletable"] = self.removal.refusal(entry) is None
        progress = self.models.load_progress(entry.id)
        if progress is not None:  # loading: how much of the weights has been read
            ext["load_progress"] = round(progress, 3)
        if loaded is not None:
            p = loaded.placement
            ext.update(
                device=p.device,
                placement=p.description,
                gpu_layers=p.gpu_layers,
                total_layers=p.total_layers,
                threads=p.threads,
                parallel=loaded.parallel,
                loaded_at=int(loaded.loaded_at),
                load_seconds=round(loaded.load_seconds, 3),  # the last load, the model process's start included
                memory_bytes=loaded.plan.ram_bytes,  # estimated from the load plan
                gpu_memory_bytes=loaded.plan.vram_bytes,
                devices=memory_by_device(loaded.plan, self.models.devices),
            )
            if p.gpu_fallback:  # the GPU ran out of memory at load: fewer layers there than planned
                ext["gpu_fallback"] = p.gpu_fallback
            if loaded.plan.draft_path:  # a draft model drafts for it (acceptance: /metrics, the log)
                ext["draft_model"] = loaded.plan.draft_id
            if loaded.plan.draft_skipped:  # it names a draft model it runs without (missing, another vocabulary...)
                ext["draft_skipped"] = loaded.plan.draft_skipped
            if loaded.plan.projector_skipped:  # loaded without its projector (no room, or it failed): text only
                ext["input_modalities"] = [m for m in entry.input_modalities if m not in ("image", "audio")]
                ext["projector_skipped"] = loaded.plan.projector_skipped
        obj["extensions"] = {"lmsp_tray": ext}
        return obj

    def model_capabilities(self, entry: ModelEntry) -> list[str]:
        return model_capabilities(entry)

    def takes_images(self, entry: ModelEntry) -> bool:
        """Whether `entry` takes images now: it has a vision projector, and is not loaded without it."""
        loaded = self.models.get(entry.id)
        return entry.vision and not (loaded is not None and loaded.plan.projector_skipped)

    def takes_audio(self, entry: ModelEntry) -> bool:
        """Whether `entry` takes audio now: its projector has an audio encoder, and is not left out."""
        loaded = self.models.get(entry.id)
        return entry.audio and not (loaded is not None and loaded.plan.projector_skipped)

    def list_models(self) -> list[dict[str, Any]]:
        return [self.model_object(e) for e in self.catalog.entries()]

    def disk_bytes(self) -> int:
        """What the models' files take on disk together (each file once)."""
        return sum({str(e.path): e.size_bytes for e in self.catalog.entries()}.values())

    def incomplete_files(self) -> list[dict[str, Any]]:
        """GGUF files found whose header is not all there yet (a copy or download in progress, or cut
        short): not models, listed apart so a person sees why they are missing."""
        listing = getattr(self.catalog, "incomplete_files", None)
        if listing is None:
            return []
        return [
            {
                "file_name": f.path.name,
                "path": str(f.path),
                "source": f.source,
                "size_bytes": f.size_bytes,
                "error": f.error,
            }
            for f in listing()
        ]

    def get_model(self, model_id: str) -> dict[str, Any]:
        entry = self.entry(model_id)
        obj = self.model_object(entry)
        cached = self.models.prompt_cache_bytes(entry)  # one folder's few files: cheap enough here
        if cached is not None:
            obj["extensions"]["lmsp_tray"]["prompt_cache_bytes"] = cached
        obj["extensions"]["lmsp_tray"]["settings"] = settings_document(self.config.models.get(entry.id))
        return obj

    async def load_model(self, model_id: str) -> dict[str, Any]:
        entry = self.entry(model_id)
        await asyncio.to_thread(self.models.acquire, entry)
        return self.model_object(entry)

    async def unload_model(self, model_id: str) -> dict[str, Any]:
        entry = self.entry(model_id)
        await asyncio.to_thread(self.models.unload, entry.id)
        return self.model_object(entry)

    # -- responses ------------------------------------------------------------------------------
    async def start_response(self, request: ResponseRequest, *, response_id: str | None = None) -> ResponseRun:
        """Everything that can fail before the first event; `response_id` is fixed in advance for tasks."""
        entry = self.entry(request.model, param="model")
        request = with_model_defaults(request, self.config.models.get(entry.id))  # the request's own win
        self._check_capabilities(entry, request)
        spec = await self._prepare(request)  # tools, tool_choice, schemas, tool results: checked before loading
        keep_alive = self._keep_alive(request)
        images = await asyncio.to_thread(decode_all, request.images) if request.images else []
        for attempt in range(2):
            model = self.models.use_if_loaded(entry.id, keep_alive=keep_alive)
            if model is None:
                model = await asyncio.to_thread(self.models.acquire, entry, keep_alive=keep_alive)
            try:
                # Rendering runs the model's template (bounded, but not free) and tokenizing asks the
                # model process: both off the event loop.
                plan, prompt, stable = await asyncio.to_thread(self._prompt_tokens, model, request, spec)
                job, queue = self._job(model, request, prompt, plan, stable, images)
                model.submit(job)
                break
            except (ServiceUnavailable, ModelCrashed):
                if attempt:
                    raise  # unloaded (or gone) twice in a row: give up
        if self._closing:  # shutdown began while this request was being prepared
            job.cancel()
            raise ServiceUnavailable("The service is shutting down; send the request again once it is back.")
        assembler = ResponseAssembler(entry.id, response_id=response_id, fields=request.response_fields)
        run = ResponseRun(assembler, job, queue, on_done=self._run_done, parser=plan.parser())
        self._runs.add(run)
        return run

    async def count_tokens(self, request: ResponseRequest) -> int:
        """The tokens `request`'s prompt renders to on its model (loaded for it if need be), with the same
        checks as a response; nothing is generated."""
        entry = self.entry(request.model, param="model")
        request = with_model_defaults(request, self.config.models.get(entry.id))
        self._check_capabilities(entry, request)
        spec = await self._prepare(request)
        keep_alive = self._keep_alive(request)
        model = self.models.use_if_loaded(entry.id, keep_alive=keep_alive)
        if model is None:
            model = await asyncio.to_thread(self.models.acquire, entry, keep_alive=keep_alive)
        loaded = model
        media = await asyncio.to_thread(decode_all, request.images) if request.images else []

        def count() -> int:  # each image and audio clip as many tokens as its projector makes of it
            window = loaded.context_length
            tokens = self._tokenize(loaded, self._plan(loaded, request, spec, window).prompt, window)
            return loaded.measure(tokens, media) if media else len(tokens)

        return await asyncio.to_thread(count)

    async def check_request(self, request: ResponseRequest) -> None:
        """The checks `start_response` makes before loading anything (a task runs them when created)."""
        self._check_capabilities(self.entry(request.model, param="model"), request)
        await self._prepare(request)
        self._keep_alive(request)

    async def _prepare(self, request: ResponseRequest) -> OutputSpec:
        """`chat.plan.prepare` (schemas compiled into grammar rules) within `max_grammar_bytes`.

        Compiling a schema can take tens of milliseconds (a long enum), so a request with tools or a
        schema, or a large one, is prepared off the event loop."""
        grammar_work = request.large or bool(request.tools) or request.json_schema is not None
        return await asyncio.to_thread(self._prepare_now, request) if grammar_work else self._prepare_now(request)

    def _prepare_now(self, request: ResponseRequest) -> OutputSpec:
        spec = prepare(request)
        size = len(spec.grammar.text().encode("utf-8"))
        limit = self.config.max_grammar_bytes
        if size > limit:
            param = "tools" if request.tools and request.json_schema is None else "response_format"
            raise InvalidRequest(
                f"The output constraint (tools and response schema) compiles to a grammar of {size:,} bytes; "
                f"the limit is {limit:,} bytes (max_grammar_bytes in config.toml). Use a smaller schema, fewer "
                f"enum values or fewer tools.",
                param=param,
            )
        return spec

    def _check_capabilities(self, entry: ModelEntry, request: ResponseRequest) -> None:
        caps = set(self.model_capabilities(entry))
        media = request.images
        if media:
            check_images(media)
            takes = (
                (ImageInput, entry.vision, "images (capability 'vision'): it has no vision projector", "a vision"),
                (
                    AudioInput,
                    entry.audio,
                    "audio (capability 'audio'): it has no projector with an audio encoder",
                    "an audio",
                ),
            )
            for kind, taken, what, choose in takes:
                first = next((m for m in media if isinstance(m, kind)), None)
                if first is not None and not taken:
                    raise UnsupportedCapability(
                        f"'{entry.id}' does not take {what} (mmproj file) beside it. Choose {choose} model, or "
                        f"send text only.",
                        param=first.param,
                    )
        if "text" not in caps and "embeddings" in caps:
            raise UnsupportedCapability(
                f"'{entry.id}' is an embedding model: it does not generate text. Use it with POST /v1/embeddings, "
                f"or choose a chat model.",
                param="model",
            )
        if "text" not in caps and "rerank" in caps:
            raise UnsupportedCapability(
                f"'{entry.id}' is a reranker (capability 'rerank'): it does not generate text. Use it with "
                f"POST /v1/rerank, or choose a chat model.",
                param="model",
            )
        if request.tools and request.tool_choice != "none" and "tools" not in caps:
            raise UnsupportedCapability(f"'{entry.id}' does not support tools.", param="tools")
        if (request.json_schema is not None or request.json_object) and "structured_output" not in caps:
            raise UnsupportedCapability(f"'{entry.id}' does not support structured output.", param="response_format")
        if request.reasoning and "reasoning" not in caps:
            raise UnsupportedCapability(
                f"'{entry.id}' does not support reasoning.", param="extensions.lmsp_tray.reasoning"
            )

    @staticmethod
    def _keep_alive(request: ResponseRequest) -> KeepAlive:
        if request.keep_alive is None:
            return DEFAULT
        try:
            return parse_duration(request.keep_alive, name="keep_alive")
        except ConfigError as exc:
            raise InvalidRequest(str(exc), param="extensions.lmsp_tray.keep_alive") from None

    @staticmethod
    def _window(model: LoadedModel, request: ResponseRequest) -> tuple[int, bool]:
        """The tokens this request may fill (prompt and output), and whether that is less than the model's
        context window because the request caps it (`context_limit`, Ollama's num_ctx: the window is the
        model's, sized at load; a request may narrow it, never widen it)."""
        window = model.context_length
        if request.context_limit is not None and request.context_limit < window:
            return request.context_limit, True
        return window, False

    def _prompt_tokens(
        self, model: LoadedModel, request: ResponseRequest, spec: OutputSpec
    ) -> tuple[ChatPlan, list[int], int]:
        """The plan, the prompt's tokens, and how many of them are its stable prefix (system and tools)."""
        if request.images and model.plan.projector_skipped:
            missing = "vision" if isinstance(request.images[0], ImageInput) else "audio"
            raise UnsupportedCapability(
                f"'{model.id}' takes text only as loaded (capability '{missing}' is missing): "
                f"{model.plan.projector_skipped}. Send text only.",
                param=request.images[0].param,
            )
        window, limited = self._window(model, request)
        if request.completion is not None:
            plan, tokens = self._completion_tokens(model, request.completion, window)
        else:
            if not request.items:
                raise InvalidRequest("'input' must contain at least one item.", param="input")
            plan = self._plan(model, request, spec, window)  # prompt for the model's family, grammar, parser
            tokens = self._tokenize(model, plan.prompt, window)
        if not tokens:
            raise InvalidRequest("The input renders to an empty prompt.", param="input")
        slots = tokens.count(IMAGE_SLOT)
        if slots != len(request.images):
            if request.images and not slots:
                raise UnsupportedCapability(
                    f"'{model.id}' was loaded without its projector (its log says why): it takes text only.",
                    param=request.images[0].param,
                )
            raise InvalidRequest(
                f"The input's text holds the image marker {IMAGE_MARKER!r}, which stands for an image part. "
                f"Leave it out of the text.",
                param="input",
            )
        if len(tokens) >= window:
            has = (
                f"this request's num_ctx is {window} tokens ('{model.id}' has {model.context_length})"
                if limited
                else f"'{model.id}' has a context window of {window} tokens"
            )
            raise InputTooLong(
                f"The input is {len(tokens)} tokens; {has} and needs room for at least one output token. "
                f"Shorten the input.",
                param="input" if request.completion is None else "prompt",
            )
        too_long = request.max_output_tokens is not None and len(tokens) + request.max_output_tokens > window
        if too_long and not request.clamp_output:
            bound = "this request's num_ctx" if limited else "the context window"
            raise ContextLengthExceeded(
                f"The input ({len(tokens)} tokens) plus max_output_tokens ({request.max_output_tokens}) exceeds "
                f"{bound} of {window} tokens; lower max_output_tokens to at most "
                f"{window - len(tokens)} or shorten the input.",
                param="max_output_tokens",
            )
        return plan, tokens, self._stable_tokens(model, plan, tokens)

    @staticmethod
    def _stable_tokens(model: LoadedModel, plan: ChatPlan, tokens: list[int]) -> int:
        """How many of the prompt's `tokens` are its stable prefix: those its text's stable characters
        tokenize to, as far as the whole prompt's tokens are the same (a token may span the boundary)."""
        if not plan.stable:
            return 0
        try:
            head = model.tokenize_prompt(plan.prompt[: plan.stable], at_most=len(tokens))
        except (InputTooLong, ContextLengthExceeded):  # more tokens than the whole prompt: none to mark
            return 0
        n = min(len(head), len(tokens))
        return next((i for i in range(n) if head[i] != tokens[i]), n)

    @staticmethod
    def _plan(model: LoadedModel, request: ResponseRequest, spec: OutputSpec, window: int) -> ChatPlan:
        """`build_plan`, refusing a conversation that renders far longer than `window` holds from the start
        of its rendering (what `token_floor` reads of a whole prompt), without rendering the rest: the
        same answer, for a fraction of the CPU (all of an 8 MiB conversation took 0.25 s of a core).
        A conversation whose text alone proves it too long (`text_floor`) is refused before rendering."""
        if request.large:
            least = text_floor(request, model.longest_piece())
            if least >= window:
                raise Service._too_long(model, least, window)
        try:
            return build_plan(model, request, spec, at_most=2 * probe_chars(window))
        except RenderedPast as past:
            floor = token_floor(model.tokenize_prompt, past.head, window)
            if floor is not None:
                raise Service._too_long(model, floor, window) from None
        return build_plan(model, request, spec)  # long, but not provably too long: all of it

    @staticmethod
    def _too_long(model: LoadedModel, floor: int, window: int, param: str = "input") -> InputTooLong:
        return InputTooLong(
            f"The input is at least {floor} tokens; '{model.id}' has a context window of {window} tokens "
            f"and needs room for at least one output token. Shorten the input.",
            param=param,
        )

    @staticmethod
    def _tokenize(model: LoadedModel, prompt: str, window: int, param: str = "input") -> list[int]:
        floor = token_floor(model.tokenize_prompt, prompt, window)
        if floor is not None:  # far too long: refused without tokenizing all of it
            raise Service._too_long(model, floor, window, param)
        try:
            return model.tokenize_prompt(prompt, at_most=window)
        except InputTooLong:
            raise
        except ContextLengthExceeded as exc:  # the model's own bound (the text's bytes over its longest piece)
            raise InputTooLong(exc.detail, param=param) from None

    def _completion_tokens(self, model: LoadedModel, raw: RawPrompt, window: int) -> tuple[ChatPlan, list[int]]:
        """A plain completion's prompt: the text as it is, or the model's fill-in-the-middle prompt.
        Its output is plain text (no thinking or call parsing)."""
        plan = ChatPlan(prompt=raw.prompt)
        if raw.suffix is None:
            return plan, self._tokenize(model, raw.prompt, window, param="prompt")
        if len(raw.prompt) + len(raw.suffix) > window * PROBE_CHARS_PER_TOKEN * 4:
            raise InputTooLong(
                f"The prompt and suffix are {len(raw.prompt) + len(raw.suffix):,} characters, far more than the "
                f"context window of {window} tokens holds. Send less context around the cursor.",
                param="prompt",
            )
        return plan, model.fim_tokens(raw.prompt, raw.suffix)

    def _job(
        self,
        model: LoadedModel,
        request: ResponseRequest,
        prompt: list[int],
        plan: ChatPlan,
        stable: int = 0,
        images: Sequence[ImagePixels | AudioClip] = (),
    ) -> tuple[GenerationJob, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        put = queue.put_nowait

        def sink(item: str | GrammarOn | TokenLogprob | Finish) -> None:
            try:
                loop.call_soon_threadsafe(put, item)
            except RuntimeError:  # the loop has closed (shutdown): nobody is reading any more
                pass

        sampling = SamplingParams(
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_k=DEFAULT_TOP_K if request.top_k is None else request.top_k,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            min_p=DEFAULT_MIN_P if request.min_p is None else request.min_p,
            repeat_penalty=1.0 if request.repeat_penalty is None else request.repeat_penalty,
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
            seed=request.seed,
            grammar=plan.grammar,
            grammar_root=plan.grammar_root,
        )
        room = self._window(model, request)[0] - len(prompt)
        max_tokens = request.max_output_tokens or room
        if request.clamp_output:
            max_tokens = min(max_tokens, room)
        job = GenerationJob(
            prompt=prompt,
            sampling=sampling,
            max_tokens=max_tokens,
            sink=sink,
            stop=request.stop,
            grammar_trigger=_lazy_grammar(plan),
            visible_tokens=plan.visible_tokens,
            logprobs=request.logprobs,
            stable_prefix=stable,
            images=images,
        )
        return job, queue

    # -- observing runs (the activity view) ----------------------------------------------------
    def add_run_listener(self, listener: Callable[[ResponseRun], None]) -> None:
        """`listener(run)` is called when a response ends, in the context of whoever read it."""
        self._run_listeners.append(listener)

    def _run_done(self, run: ResponseRun) -> None:
        if run not in self._runs:
            return  # the generator's clean-up runs once; this guards against a second call
        self._runs.discard(run)
        self._finished_output_tokens += run.finish.output_tokens if run.finish is not None else run.pieces
        for listener in list(self._run_listeners):
            try:
                listener(run)
            except Exception:  # a broken observer must not break a response
                log.exception("run listener failed")

    def output_tokens(self) -> int:
        """Tokens generated since start: finished responses' counts plus running ones' pieces so far."""
        return self._finished_output_tokens + sum(run.pieces for run in list(self._runs))

    # -- shutdown -------------------------------------------------------------------------------
    def cancel_all(self) -> None:
        """End every running response (shutdown): each stream gets its terminal event; responses
        still being prepared are refused (503) instead of starting."""
        self._closing = True
        for run in list(self._runs):
            run.cancel()


def _logprob_entry(item: TokenLogprob) -> dict[str, Any]:
    """OpenAI's `{token, logprob, bytes, top_logprobs}` for one token."""

    def one(piece: bytes, logprob: float) -> dict[str, Any]:
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

    return {**one(item.piece, item.logprob), "top_logprobs": [one(p, lp) for p, lp in item.top]}


def _lazy_grammar(plan: ChatPlan) -> CallMarkers | None:
    """The engine's trigger for a plan whose grammar switches on at a call marker (`tool_choice: auto`)."""
    if not plan.lazy_roots:
        return None
    cfg = plan.parser_config
    return CallMarkers(tuple(plan.lazy_roots.items()), cfg.think, cfg.start_in_think)
