"""Ollama's `/api/chat`, `/api/generate` and `/api/embed` bodies: validated at the edge, turned into the service's requests.

Why: most local-model apps (Open WebUI, Home Assistant, the JetBrains and VS Code
Ollama providers, the `ollama` Python and JavaScript clients) speak Ollama's API.
A chat or generate request is the same work as a `/v1` one with another spelling —
sampling under `options`, `num_predict` for the output limit, `format` for JSON
output, `think` for reasoning, tool call arguments as objects, `keep_alive` as a Go
duration — so this module validates a body (pydantic, liberal where Ollama is:
unknown options and fields are ignored) and converts it into a `ResponseRequest`
that runs through the same responder, scheduler, template and grammars as `/v1`.

Images (`images`: base64 strings) go to a model that takes them, before the message's
text, in user messages and non-raw generate prompts. What is refused, clearly (400): images
elsewhere, a `template` other than the model's own (Ollama's Go templates are not
run here), a `suffix` with `raw` text that is not a fill-in-the-middle model's (the
engine says so). A request with no prompt / no messages is a load (or, with
`keep_alive: 0`, an unload) of the model, as Ollama's clients use it: `Lifecycle`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.images import ImageInput, from_base64, join_parts
from lmsp_tray.protocol.keep_alive import DEFAULT, KeepAlive
from lmsp_tray.protocol.openai_sampling import SEED_RANGE
from lmsp_tray.protocol.requests import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    RawPrompt,
    ResponseRequest,
    Tool,
    check_stop_list,
    items_size,
    schema_size,
)
from lmsp_tray.protocol.validation import validated

_GO_DURATION = re.compile(r"^([+-]?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+$")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
NEVER = -1.0  # a keep-alive that keeps the model loaded (the service's own spelling of "never")


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(_Edge):
    """Ollama's `options` this service acts on; the others (num_gpu, mirostat, …) are ignored, as Ollama
    ignores an option a runner does not know. `num_ctx` caps the request: the prompt and the output
    together stay within it (a longer prompt is refused naming it; the output stops there, done_reason
    "length"). The model's window itself is sized at load from memory (`context_cap` in config.toml) and
    shared by every request: a larger num_ctx does not reload the model, the model's window applies
    (`/api/show` and `/api/ps` give it)."""

    temperature: float | None = Field(default=None, ge=0)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: list[str] | None = None
    num_predict: int | None = None
    num_ctx: int | None = None
    repeat_penalty: float | None = Field(default=None, ge=0, le=10)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        return check_stop_list([value] if isinstance(value, str) else value)


class CallFunction(_Edge):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCallIn(_Edge):
    id: str | None = None
    function: CallFunction


class ChatMessage(_Edge):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = ""
    thinking: str | None = None  # sent back by clients; the model does not need it again
    images: list[Any] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ToolFunction(_Edge):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolIn(_Edge):
    type: Literal["function"] = "function"
    function: ToolFunction


class _Common(_Edge):
    model: str = Field(min_length=1)
    stream: bool = True  # Ollama streams unless told not to
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: float | int | str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None


class ChatCreate(_Common):
    messages: list[ChatMessage] | None = None
    tools: list[ToolIn] | None = None


class GenerateCreate(_Common):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class EmbedCreate(_Edge):
    model: str = Field(min_length=1)
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)
    keep_alive: float | int | str | None = None
    options: dict[str, Any] | None = None


class LegacyEmbedCreate(_Edge):
    """`POST /api/embeddings`: one `prompt`, one vector (`embedding`); no truncation."""

    model: str = Field(min_length=1)
    prompt: str = ""
    keep_alive: float | int | str | None = None
    options: dict[str, Any] | None = None


@dataclass(frozen=True)
class Lifecycle:
    """A request with nothing to generate: load the model (`unload` False) or unload it (`keep_alive: 0`)."""

    model: str
    unload: bool
    keep_alive: KeepAlive  # seconds, None for never, DEFAULT: the configured keep-alive


@dataclass(frozen=True)
class OllamaRun:
    """A chat or generate request to run, with what only Ollama's answer needs."""

    request: ResponseRequest
    model: str  # the name as asked (Ollama's answers repeat it)


@dataclass(frozen=True)
class EmbedAsk:
    model: str
    inputs: tuple[str, ...]
    truncate: bool
    dimensions: int | None
    keep_alive: KeepAlive


def keep_alive_seconds(value: float | str | None) -> KeepAlive:
    """Ollama's `keep_alive`: a Go duration ("5m", "1h30m", "300ms") or seconds; negative keeps the model
    loaded (None), 0 unloads it once idle; absent: DEFAULT (the configured keep-alive)."""
    if value is None:
        return DEFAULT
    if isinstance(value, bool):
        raise InvalidRequest("'keep_alive' must be a duration such as '5m', or seconds.", param="keep_alive")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    text = value.strip()
    if re.fullmatch(r"[+-]?\d+(?:\.\d+)?", text):
        return keep_alive_seconds(float(text))
    if not _GO_DURATION.match(text):
        raise InvalidRequest(
            f"'keep_alive' {value!r} is not a duration: use e.g. '5m', '1h30m', '30s', seconds, or -1 to keep "
            f"the model loaded.",
            param="keep_alive",
        )
    seconds = sum(float(n) * _GO_UNITS[u] for n, u in _GO_PART.findall(text))
    return None if text.startswith("-") else seconds


def _sampling(edge: _Common) -> dict[str, Any]:
    """`options` as the service's sampling fields (`num_predict` -1 / -2: no limit but the window)."""
    opts = edge.options or Options()
    seed = None if opts.seed is None or opts.seed < 0 else opts.seed % SEED_RANGE
    limit = opts.num_predict if opts.num_predict is not None and opts.num_predict > 0 else None
    context = opts.num_ctx if opts.num_ctx is not None and opts.num_ctx > 0 else None
    return {
        "max_output_tokens": limit,
        "context_limit": context,
        # Within num_ctx, num_predict is a ceiling (Ollama fills the context rather than refusing)
        "clamp_output": context is not None,
        "temperature": opts.temperature,
        "top_p": opts.top_p,
        "top_k": opts.top_k,
        "min_p": opts.min_p,
        "seed": seed,
        "stop": list(opts.stop or []),
        "repeat_penalty": opts.repeat_penalty or None,
        "presence_penalty": opts.presence_penalty or 0.0,
        "frequency_penalty": opts.frequency_penalty or 0.0,
    }


def _format(edge: _Common) -> tuple[dict[str, Any] | None, bool]:
    """`format`: "json" (any JSON object) or a JSON Schema — both grammar-constrained."""
    if isinstance(edge.format, dict):
        return edge.format or {"type": "object"}, False
    return None, edge.format == "json"


def _lifecycle(edge: _Common) -> Lifecycle:
    keep = keep_alive_seconds(edge.keep_alive)
    return Lifecycle(edge.model, unload=keep == 0, keep_alive=keep)


def _no_images(images: list[Any] | None, param: str) -> None:
    if images:
        raise UnsupportedCapability("Images go in user messages (and generate prompts that are not raw).", param=param)


def _user(text: str, images: list[Any] | None, param: str) -> Message:
    """A user message; its images (base64 strings) come before its text, as Ollama puts them."""
    if not images:
        return Message("user", text)
    parts: list[str | ImageInput] = [
        from_base64(image if isinstance(image, str) else "", f"{param}[{k}]") for k, image in enumerate(images)
    ]
    return Message("user", *join_parts([*parts, text]))


def _arguments(value: dict[str, Any] | str) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _items(messages: list[ChatMessage]) -> list[Item]:
    """Ollama's messages as the service's items. Tool calls get ids when the client sent none; a tool
    result names its call by `tool_call_id`, else by `tool_name` (the latest unanswered call of that
    name), else it answers the oldest unanswered call."""
    items: list[Item] = []
    open_calls: list[tuple[str, str]] = []  # (call id, name) not answered yet
    for i, message in enumerate(messages):
        if message.role != "user":
            _no_images(message.images, f"messages[{i}].images")
        text = message.content or ""
        if message.role in ("system", "developer"):
            items.append(Message("system", text))
        elif message.role == "user":
            items.append(_user(text, message.images, f"messages[{i}].images"))
        elif message.role == "assistant":
            if text or not message.tool_calls:
                items.append(Message("assistant", text))
            for j, call in enumerate(message.tool_calls or []):
                call_id = call.id or f"call_{i}_{j}"
                items.append(FunctionCall(call_id, call.function.name, _arguments(call.function.arguments)))
                open_calls.append((call_id, call.function.name))
        else:  # a tool's result
            match = next((c for c in open_calls if c[0] == message.tool_call_id), None)
            if match is None and message.tool_name:
                match = next((c for c in reversed(open_calls) if c[1] == message.tool_name), None)
            if match is None and open_calls:
                match = open_calls[0]
            if match is None:
                raise InvalidRequest(
                    f"messages[{i}] is a tool result, but no earlier assistant message called a tool.",
                    param=f"messages[{i}]",
                )
            open_calls.remove(match)
            items.append(FunctionCallOutput(match[0], text))
    return items


def _reasoning(edge: _Common) -> bool | None:
    return None if edge.think is None else edge.think is not False


def parse_chat(body: Any) -> OllamaRun | Lifecycle:
    """Validate a decoded `POST /api/chat` body, or raise a typed error naming the field."""
    edge: ChatCreate = validated(ChatCreate, body)
    if not edge.messages:
        return _lifecycle(edge)
    items = _items(edge.messages)
    tools = [
        Tool(
            t.function.name,
            t.function.description,
            t.function.parameters if t.function.parameters else {"type": "object", "properties": {}},
        )
        for t in edge.tools or []
    ]
    schema, json_object = _format(edge)
    size = items_size(items) + sum(len(t.description or "") + schema_size(t.parameters) for t in tools)
    request = ResponseRequest(
        model=edge.model,
        items=items,
        stream=edge.stream,
        keep_alive=_keep(edge),
        reasoning=_reasoning(edge),
        json_schema=schema,
        json_object=json_object,
        tools=tools,
        raw=body,
        size=size + schema_size(schema),
        **_sampling(edge),
    ).settle()
    return OllamaRun(request, edge.model)


def _keep(edge: _Common) -> float | None:
    """The keep-alive in the service's spelling (`parse_duration`: seconds, -1 for never)."""
    keep = keep_alive_seconds(edge.keep_alive)
    if keep is DEFAULT:
        return None
    return NEVER if keep is None else float(keep)


def parse_generate(body: Any) -> OllamaRun | Lifecycle:
    """Validate a decoded `POST /api/generate` body, or raise a typed error naming the field."""
    edge: GenerateCreate = validated(GenerateCreate, body)
    if edge.raw or edge.suffix is not None:
        _no_images(edge.images, "images")
    if edge.template:
        raise InvalidRequest(
            "'template' is not supported: this service renders prompts with the model's own chat template "
            "(Ollama's Go templates are not run here). Leave it out, or send 'raw': true with the prompt "
            "already formatted.",
            param="template",
        )
    if not edge.prompt and edge.suffix is None:
        return _lifecycle(edge)
    prompt = edge.prompt or ""
    schema, json_object = _format(edge)
    completion: RawPrompt | None = None
    items: list[Item] = []
    if edge.raw or edge.suffix is not None:
        completion = RawPrompt(prompt, edge.suffix)  # the text as it is, or filled in with FIM tokens
    else:
        if edge.system:
            items.append(Message("system", edge.system))
        items.append(_user(prompt, edge.images, "images"))
    request = ResponseRequest(
        model=edge.model,
        items=items,
        stream=edge.stream,
        keep_alive=_keep(edge),
        reasoning=_reasoning(edge) if completion is None else None,
        json_schema=schema,
        json_object=json_object,
        raw=body,
        size=len(prompt) + len(edge.suffix or "") + len(edge.system or "") + schema_size(schema),
        completion=completion,
        **_sampling(edge),
    ).settle()
    return OllamaRun(request, edge.model)


def parse_embed(body: Any) -> EmbedAsk:
    """`POST /api/embed`: `input` a string or a list of strings; `truncate` (default true) cuts an input
    to the model's window instead of refusing it."""
    edge: EmbedCreate = validated(EmbedCreate, body)
    inputs = (edge.input,) if isinstance(edge.input, str) else tuple(edge.input)
    return EmbedAsk(edge.model, inputs, edge.truncate, edge.dimensions, keep_alive_seconds(edge.keep_alive))


def parse_legacy_embed(body: Any) -> EmbedAsk:
    """`POST /api/embeddings`: one `prompt` (an empty one answers an empty vector, as Ollama does)."""
    edge: LegacyEmbedCreate = validated(LegacyEmbedCreate, body)
    inputs = (edge.prompt,) if edge.prompt else ()
    return EmbedAsk(edge.model, inputs, False, None, keep_alive_seconds(edge.keep_alive))


def parse_model_name(body: Any, *, field: str = "model") -> str:
    """The model a `show`, `pull` or `delete` body names (`model`, or the older `name`)."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    value = body.get(field) or body.get("name")
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"'{field}' is required: name a model.", param=field)
    return value.strip()
