"""OpenAI Chat Completions requests: validated at the edge, turned into the service's `ResponseRequest`.

Why: most local-model apps (editor assistants, chat front-ends, LangChain,
the OpenAI SDKs) speak `POST /v1/chat/completions`. The service already runs
Responses-style requests (`ResponseRequest`): a chat request is the same work
with another spelling — `messages` instead of `input` items, tools nested
under `function`, `max_tokens`, `stop` at the top level, tool results as
`role: tool` messages. This module validates a chat body (pydantic, strict
where a mistake would change the answer, liberal where clients differ
harmlessly) and converts it; `openai_chunks` turns the service's events back
into chat completion objects and chunks.

What is refused, clearly (400): `n` other than 1, images and audio in
content. `logprobs` / `top_logprobs` (up to 20) come from the model's raw
logits, for the tokens of a plain answer (not of thinking or tool calls).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.requests import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    LmspTrayOptions,
    Message,
    ResponseRequest,
    Tool,
    _schema_size,
    _translate,
    check_stop_list,
    items_size,
)

MAX_TOP_LOGPROBS = 20
SEED_RANGE = 2**32 - 1  # llama.cpp's seeds: 0 .. 2**32 - 2 (the last value means "random")
M = TypeVar("M", bound=BaseModel)
_IMAGE_PARTS = frozenset({"image_url", "input_audio", "file", "image", "audio", "input_image", "input_file"})


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Edge):
    type: Literal["text", "input_text", "output_text"]
    text: str


class RefusalPart(_Edge):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


def _content(value: Any) -> Any:
    """A string stays a string; parts are checked for the kinds this service cannot read."""
    if isinstance(value, list):
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _IMAGE_PARTS:
                raise _Unreadable(kind, i)
    return value


class _WithContent(_Edge):
    @field_validator("content", mode="before", check_fields=False)
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _content(value)


class FunctionRef(_Edge):
    name: str = Field(min_length=1)
    arguments: str = ""

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments(cls, value: Any) -> Any:
        # Some clients send the arguments back as an object rather than its JSON text.
        if isinstance(value, dict):
            return json.dumps(value, ensure_ascii=False)
        return "" if value is None else value


class ToolCall(_Edge):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionRef


class SystemMessage(_WithContent):
    role: Literal["system", "developer"]
    content: str | list[Part]
    name: str | None = None


class UserMessage(_WithContent):
    role: Literal["user"]
    content: str | list[Part]
    name: str | None = None


class AssistantMessage(_WithContent):
    role: Literal["assistant"]
    content: str | list[Part] | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # sent back by some clients; the model does not need it again
    refusal: str | None = None
    name: str | None = None


class ToolMessage(_WithContent):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1)
    content: str | list[Part]


class FunctionMessage(_Edge):
    """The deprecated `role: function` result (OpenAI's functions API): the output of the last call by name."""

    role: Literal["function"]
    name: str = Field(min_length=1)
    content: str | None = None


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage, Field(discriminator="role")
]


class FunctionDef(_Edge):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Edge):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Edge):
    name: str = Field(min_length=1)


class NamedChoice(_Edge):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaSpec(_Edge):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ChatResponseFormat(_Edge):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None


class StreamOptions(_Edge):
    include_usage: bool = False


class ChatCompletionCreate(_Edge):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    n: int | None = Field(default=None, ge=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ChatResponseFormat | None = None
    # this service's own options (as on /lmsp/v1): top_k, min_p, repeat_penalty, keep_alive, reasoning
    extensions: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        return check_stop_list(value)


class _Unreadable(ValueError):
    def __init__(self, kind: str, index: int) -> None:
        super().__init__(kind)
        self.kind = kind
        self.index = index


@dataclass
class ChatRequest:
    """A validated chat completion request: the service's request and what only the chat shape needs."""

    request: ResponseRequest
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0


def _text(content: str | list[Any] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


def _items(messages: list[Any]) -> list[Item]:
    """Chat messages as the service's items: tool calls and their results become call / output items."""
    items: list[Item] = []
    last_call_by_name: dict[str, str] = {}
    for i, message in enumerate(messages):
        if isinstance(message, SystemMessage):
            items.append(Message("system", _text(message.content)))
        elif isinstance(message, UserMessage):
            items.append(Message("user", _text(message.content)))
        elif isinstance(message, AssistantMessage):
            text = _text(message.content)
            if text or not message.tool_calls:
                items.append(Message("assistant", text))
            for call in message.tool_calls or []:
                items.append(FunctionCall(call.id, call.function.name, call.function.arguments or "{}"))
                last_call_by_name[call.function.name] = call.id
        elif isinstance(message, ToolMessage):
            items.append(FunctionCallOutput(message.tool_call_id, _text(message.content)))
        elif isinstance(message, FunctionMessage):
            call_id = last_call_by_name.get(message.name)
            if call_id is None:
                raise InvalidRequest(
                    f"messages[{i}] is the result of function '{message.name}', which no earlier assistant "
                    f"message called.",
                    param=f"messages[{i}]",
                )
            items.append(FunctionCallOutput(call_id, message.content or ""))
    return items


def _options(extensions: dict[str, Any] | None) -> dict[str, Any]:
    ext = (extensions or {}).get("lmsp_tray") if isinstance(extensions, dict) else None
    if ext is None:
        return {}
    if not isinstance(ext, dict):
        raise InvalidRequest("extensions.lmsp_tray must be an object.", param="extensions.lmsp_tray")
    try:
        opts = LmspTrayOptions.model_validate(ext)
    except ValidationError as exc:
        raise _translate(exc, prefix=("extensions", "lmsp_tray")) from None
    return opts.model_dump(exclude_none=True)


def validated(edge_model: type[M], body: Any) -> M:
    """A decoded `/v1` body validated as `edge_model`, or a 400 naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return edge_model.model_validate(body)
    except ValidationError as exc:
        raise _chat_error(exc) from None


def stop_and_seed(stop: str | list[str] | None, seed: int | None, opts: dict[str, Any]) -> tuple[list[str], int | None]:
    """The stop strings (the request's, else `extensions.lmsp_tray.stop`) and the seed
    (`extensions.lmsp_tray.seed`, else the request's)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    chosen = opts.get("seed")
    if chosen is None and seed is not None:
        chosen = seed % SEED_RANGE  # OpenAI takes any integer; llama.cpp a 32-bit one
    return stops or list(opts.get("stop") or []), chosen


def parse_chat_create(body: Any) -> ChatRequest:
    """Validate a decoded `POST /v1/chat/completions` body, or raise a typed error naming the field."""
    edge = validated(ChatCompletionCreate, body)
    if edge.n is not None and edge.n != 1:
        raise InvalidRequest(
            "'n' must be 1: this service returns one choice per request; send several requests for more.",
            param="n",
        )
    if edge.top_logprobs and not edge.logprobs:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    opts = _options(edge.extensions)
    items = _items(edge.messages)
    tools = [
        Tool(
            t.function.name,
            t.function.description,
            t.function.parameters if t.function.parameters is not None else {"type": "object", "properties": {}},
        )
        for t in edge.tools or []
    ]
    tool_choice: str | dict[str, str] = "auto"
    if isinstance(edge.tool_choice, NamedChoice):
        tool_choice = {"type": "function", "name": edge.tool_choice.function.name}
    elif edge.tool_choice is not None:
        tool_choice = edge.tool_choice
    fmt = edge.response_format
    json_schema: dict[str, Any] | None = None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise InvalidRequest(
                "'response_format.json_schema' is required when type is 'json_schema'.",
                param="response_format.json_schema",
            )
        json_schema = fmt.json_schema.schema_ or {"type": "object"}
    stop, seed = stop_and_seed(edge.stop, edge.seed, opts)
    size = (
        items_size(items)
        + sum(len(t.description or "") + _schema_size(t.parameters) for t in tools)
        + _schema_size(json_schema)
    )
    request = ResponseRequest(
        model=edge.model,
        items=items,
        stream=edge.stream,
        max_output_tokens=edge.max_completion_tokens or edge.max_tokens,
        temperature=edge.temperature,
        top_p=opts.get("top_p", edge.top_p),
        top_k=opts.get("top_k"),
        min_p=opts.get("min_p"),
        seed=seed,
        stop=stop,
        repeat_penalty=opts.get("repeat_penalty"),
        presence_penalty=edge.presence_penalty or 0.0,
        frequency_penalty=edge.frequency_penalty or 0.0,
        keep_alive=opts.get("keep_alive"),
        reasoning=opts.get("reasoning"),
        json_schema=json_schema,
        json_object=fmt is not None and fmt.type == "json_object",
        tools=tools,
        tool_choice=tool_choice,
        raw=body,
        size=size,
        logprobs=(edge.top_logprobs or 0) if edge.logprobs else None,
    )
    return ChatRequest(
        request,
        include_usage=bool(edge.stream and edge.stream_options and edge.stream_options.include_usage),
        logprobs=bool(edge.logprobs),
        top_logprobs=edge.top_logprobs or 0,
    )


_UNION_LABELS = frozenset({"str", "list[tagged-union[TextPart,RefusalPart]]", "NamedChoice", "function-after"})


def _chat_error(exc: ValidationError) -> Exception:
    """The first pydantic error as a 400 naming the field (`messages[2].content`)."""
    err = exc.errors(include_url=False)[0]
    ctx_error = (err.get("ctx") or {}).get("error")
    param = _param(tuple(err.get("loc") or ()))
    if isinstance(ctx_error, _Unreadable):
        return UnsupportedCapability(
            f"Content of type '{ctx_error.kind}' cannot be read: the models this service runs take text only.",
            param=f"{param}[{ctx_error.index}]" if param else None,
        )
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "missing":
        detail = f"'{param}' is required."
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        detail = f"'{param}' has an unknown or missing tag: {msg}."
    else:
        detail = f"'{param}': {msg}." if param else f"{msg}."
    return InvalidRequest(detail, param=param or None)


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", "text", "refusal"})


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    after_index = False
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
            after_index = True
            continue
        seg = str(seg)
        if after_index and seg in _ROLES:  # the discriminator tag pydantic inserts after a list index
            after_index = False
            continue
        after_index = False
        if seg in _UNION_LABELS or "[" in seg or seg.startswith("function-"):
            continue
        seg = {"schema_": "schema"}.get(seg, seg)
        out += ("." if out else "") + seg
    return out
