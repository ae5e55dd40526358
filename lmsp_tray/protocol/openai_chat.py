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

What is refused, clearly (400): `n` other than 1, audio and files in
content, images by URL (`image_url` parts are taken as `data:` URLs only). `logprobs` / `top_logprobs` (up to 20) come from the model's raw
logits, for the tokens of a plain answer (not of thinking or tool calls).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import Media, audio_from_base64, from_url, join_parts
from lmsp_tray.protocol.openai_sampling import lmsp_options, sampling
from lmsp_tray.protocol.requests import (
    FunctionCall,
    FunctionCallOutput,
    InputAudio,
    Item,
    Message,
    ResponseRequest,
    Tool,
    check_stop_list,
    items_size,
    schema_size,
)
from lmsp_tray.protocol.validation import RefusedPart, validated

MAX_TOP_LOGPROBS = 20
_IMAGE_PARTS = frozenset({"file", "image", "audio", "input_image", "input_file"})


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Edge):
    type: Literal["text", "input_text", "output_text"]
    text: str


class RefusalPart(_Edge):
    type: Literal["refusal"]
    refusal: str


class ImageURL(_Edge):
    url: str
    detail: str | None = None  # ignored: the model's projector decides the resolution


class ImagePart(_Edge):
    type: Literal["image_url"]
    image_url: ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value  # some clients send the URL alone


class AudioPart(_Edge):
    type: Literal["input_audio"]
    input_audio: InputAudio


Part = Annotated[TextPart | RefusalPart | ImagePart | AudioPart, Field(discriminator="type")]
MEDIA_PARTS = (ImagePart, AudioPart)


def _content(value: Any) -> Any:
    """A string stays a string; parts are checked for the kinds this service cannot read."""
    if isinstance(value, list):
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _IMAGE_PARTS:
                raise RefusedPart(
                    f"Content of type '{kind}' cannot be read: the models this service runs take text, images "
                    f"(image_url parts) and audio (input_audio parts) only.",
                    i,
                )
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
    return "".join(
        p.text if isinstance(p, TextPart) else p.refusal if isinstance(p, RefusalPart) else "" for p in content
    )


def _part(part: Any, param: str) -> str | Media:
    if isinstance(part, ImagePart):
        return from_url(part.image_url.url, param)
    if isinstance(part, AudioPart):
        return audio_from_base64(part.input_audio.data, part.input_audio.format, param)
    return _text([part])


def _user_message(content: str | list[Any] | None, param: str) -> Message:
    """A user message; with images or audio, its text as llama-server renders content parts, and its media."""
    if not isinstance(content, list) or not any(isinstance(p, MEDIA_PARTS) for p in content):
        return Message("user", _text(content))
    text, media = join_parts([_part(p, f"{param}[{j}]") for j, p in enumerate(content)])
    return Message("user", text, media)


def _items(messages: list[Any]) -> list[Item]:
    """Chat messages as the service's items: tool calls and their results become call / output items."""
    items: list[Item] = []
    last_call_by_name: dict[str, str] = {}
    for i, message in enumerate(messages):
        content = getattr(message, "content", None)
        media = isinstance(content, list) and any(isinstance(p, MEDIA_PARTS) for p in content)
        if media and not isinstance(message, UserMessage):
            raise InvalidRequest("Only user messages may hold images or audio.", param=f"messages[{i}].content")
        if isinstance(message, SystemMessage):
            items.append(Message("system", _text(message.content)))
        elif isinstance(message, UserMessage):
            items.append(_user_message(message.content, f"messages[{i}].content"))
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
    opts = lmsp_options(edge.extensions)
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
    size = (
        items_size(items)
        + sum(len(t.description or "") + schema_size(t.parameters) for t in tools)
        + schema_size(json_schema)
    )
    request = ResponseRequest(
        model=edge.model,
        items=items,
        stream=edge.stream,
        max_output_tokens=edge.max_completion_tokens or edge.max_tokens,
        **sampling(edge, opts),
        reasoning=opts.get("reasoning"),
        json_schema=json_schema,
        json_object=fmt is not None and fmt.type == "json_object",
        tools=tools,
        tool_choice=tool_choice,
        raw=body,
        size=size,
        logprobs=(edge.top_logprobs or 0) if edge.logprobs else None,
    ).settle()
    return ChatRequest(
        request,
        include_usage=bool(edge.stream and edge.stream_options and edge.stream_options.include_usage),
        logprobs=bool(edge.logprobs),
        top_logprobs=edge.top_logprobs or 0,
    )
