"""Validation of `POST /responses` bodies: pydantic at the edge, plain dataclasses inside.

Strict in what it accepts where a mistake would change the answer (types,
ranges, reserved content types), liberal where existing Responses-style
clients differ harmlessly: `input` as a plain string, a message item without
`type`, `content` as a string, a `developer` role, `instructions`,
`text.format` for the response format, and unknown top-level fields (ignored).
Every rejection is an `InvalidRequest` naming the field at fault.

A request's `size` (the characters of its text, call arguments, tool outputs
and schemas) is what the work before its first token grows with — validation,
rendering, tokenizing, grammar building. Callers do that work off the event
loop for a `large` request, so a long history never holds up other streams.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import Media, audio_from_base64, from_url, join_parts
from lmsp_tray.protocol.validation import RefusedPart, request_error

RESERVED_CONTENT = frozenset({"input_file", "image", "image_url", "audio", "file", "input_video"})
MAX_STOP_SEQUENCES = 8
MAX_C_INT = 2**31 - 1  # what llama.cpp's int parameters hold
LARGE_REQUEST_CHARS = 16_000  # from this size on, a request is prepared off the event loop
INPUT_BATCH = 256  # a longer `input` is validated this many items at a time (`_validate_input`)


def check_stop_list(value: Any) -> Any:
    """The bounds on a list of stop sequences (how many, none empty), shared by every request shape."""
    if isinstance(value, list):
        if len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(isinstance(s, str) and not s for s in value):
            raise ValueError("stop sequences must not be empty")
    return value


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class InputTextPart(_Edge):
    type: Literal["input_text", "text"]
    text: str


class OutputTextPart(_Edge):
    type: Literal["output_text"]
    text: str


class RefusalPart(_Edge):
    type: Literal["refusal"]
    refusal: str


class InputImagePart(_Edge):
    """An image (an extension of LMSP 1.0, which reserves image content: OpenAI's Responses shape)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None  # ignored: the model's projector decides the resolution


class InputAudio(_Edge):
    data: str
    format: str | None = None  # "wav" | "mp3" (OpenAI's); "flac" read too


class InputAudioPart(_Edge):
    """Audio (an extension of LMSP 1.0, which reserves audio content: OpenAI's `input_audio` shape)."""

    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[
    InputTextPart | OutputTextPart | RefusalPart | InputImagePart | InputAudioPart, Field(discriminator="type")
]
MEDIA_PARTS = (InputImagePart, InputAudioPart)


class PlainMessageItem(_Edge):
    """A message item checked by compiled code alone (`content` as a string or parts, no Python validator):
    what the items of a long `input` are validated as first (`_validate_input`). `MessageItem` words
    the errors."""

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None


class MessageItem(PlainMessageItem):
    """A message item whose errors are worded for a person (a string `content` becomes one text part; a
    reserved content type is refused by name); it accepts exactly what `PlainMessageItem` does."""

    content: list[ContentPart]

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "input_text", "text": value}]
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                kind = kind if isinstance(kind, str) else None  # {"type": {}} must be a 400, not a crash
                if kind in RESERVED_CONTENT:
                    raise RefusedPart(
                        f"Content type '{kind}' is reserved in LMSP 1.0; this service accepts text, "
                        f"input_image and input_audio only.",
                        i,
                    )
        return value


class FunctionCallItem(_Edge):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(_Edge):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str
    id: str | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _output(cls, value: Any) -> Any:
        # Some clients send output as content parts; keep their text.
        if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in value):
            return "".join(p["text"] for p in value)
        return value


class ReasoningItem(_Edge):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]


class JSONSchemaFormat(_Edge):
    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Edge):
    type: Literal["text", "json_schema", "json_object"]
    json_schema: JSONSchemaFormat | None = None
    # Responses-style `text.format` puts name/schema at this level.
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            if self.schema_ is None:
                raise ValueError("json_schema.schema is required when type is 'json_schema'")
            self.json_schema = JSONSchemaFormat(name=self.name or "response", schema=self.schema_)
        return self


class FunctionTool(_Edge):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class NamedToolChoice(_Edge):
    type: Literal["function"]
    name: str


class LmspTrayOptions(_Edge):
    """`extensions.lmsp_tray`: this service's own sampling and lifecycle options."""

    seed: int | None = Field(default=None, ge=0, le=2**32 - 2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=MAX_C_INT)
    min_p: float | None = Field(default=None, ge=0, le=1)
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(default=None, gt=0, le=10)
    keep_alive: float | str | None = None
    reasoning: bool | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        return check_stop_list([value] if isinstance(value, str) else value)


class TextOptions(_Edge):
    """`text`: Responses-style output options; `format` is the response format."""

    format: ResponseFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponseCreate(_Edge):
    model: str = Field(min_length=1)
    input: list[InputItem]
    instructions: str | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    response_format: ResponseFormat | None = None
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    store: bool = False
    previous_response_id: str | None = None
    extensions: dict[str, Any] = Field(default_factory=dict)
    # Fields of OpenAI's Responses API this service does not act on: accepted when well-typed, so a
    # client's mistake is a 400 naming the field instead of being ignored silently.
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    service_tier: str | None = None
    background: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": value}]
        if isinstance(value, list):
            return [
                {**item, "type": "message"}
                if isinstance(item, dict) and "type" not in item and "role" in item
                else item
                for item in value
            ]
        return value

    @field_validator("extensions", mode="before")
    @classmethod
    def _extensions(cls, value: Any) -> Any:
        return {} if value is None else value


_INPUT_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem], config=ConfigDict(strict=True))
PlainInputItem = Annotated[
    PlainMessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]
_PLAIN_INPUT_ITEMS: TypeAdapter[list[PlainInputItem]] = TypeAdapter(
    list[PlainInputItem], config=ConfigDict(strict=True)
)


def _validate_input(items: list[Any]) -> list[Any]:
    """A long `input` validated `INPUT_BATCH` items at a time, letting other threads run between batches.

    Validation runs in compiled code that holds the GIL throughout: 20,000 messages (an 8 MiB body)
    held it ~200 ms at once, and with it the event loop and every stream's next token. A large body
    is validated on a worker thread; `time.sleep(0)` there hands the GIL back between batches.

    Each batch is validated as `PlainInputItem`s first, without a Python call per message: 23,000
    messages took 221 ms with `MessageItem`'s validator and 63 ms without it. A batch that fails is
    validated again as `InputItem`s, whose first error is the one a client reads."""
    out: list[Any] = []
    for start in range(0, len(items), INPUT_BATCH):
        if start:
            time.sleep(0)
        batch = items[start : start + INPUT_BATCH]
        try:
            out.extend(_PLAIN_INPUT_ITEMS.validate_python(batch))
        except ValidationError:
            try:
                out.extend(_INPUT_ITEMS.validate_python(batch))
            except ValidationError as exc:
                raise request_error(exc, prefix=("input",), offset=start) from None
    return out


# ---------------------------------------------------------------------------------------------
# Internal form


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant   (developer folds into system)
    text: str  # with protocol.images.IMAGE_MARKER where each of `images` goes
    images: tuple[Media, ...] = ()  # its images and audio clips, in order


@dataclass(frozen=True)
class FunctionCall:
    call_id: str
    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class FunctionCallOutput:
    call_id: str
    output: str


Item = Message | FunctionCall | FunctionCallOutput


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]


@dataclass(frozen=True)
class RawPrompt:
    """A plain completion (`POST /v1/completions`): text continued as it is, no chat template; with a
    `suffix`, the model fills in the middle between `prompt` and `suffix` with its FIM tokens."""

    prompt: str
    suffix: str | None = None


@dataclass
class ResponseRequest:
    """A validated request, independent of HTTP and pydantic."""

    model: str
    items: list[Item]
    stream: bool = False
    max_output_tokens: int | None = None
    clamp_output: bool = False  # max_output_tokens is a ceiling the context window may lower (Anthropic's max_tokens)
    context_limit: int | None = None  # the request's own cap on the window, never above the model's (Ollama's num_ctx)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    repeat_penalty: float | None = None
    presence_penalty: float = 0.0  # OpenAI's penalties (chat completions), applied by llama.cpp's penalties sampler
    frequency_penalty: float = 0.0
    keep_alive: float | str | None = None
    reasoning: bool | None = None
    json_schema: dict[str, Any] | None = None  # response_format json_schema's schema
    json_object: bool = False
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | dict[str, str] = "auto"
    store: bool = False
    previous_response_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # the body as received (for storage/idempotency)
    input_items: list[dict[str, Any]] = field(default_factory=list)  # `input` as sent, as items (when `store`)
    size: int = 0  # characters of text, arguments, outputs and schemas (see the module docstring)
    response_fields: dict[str, Any] = field(default_factory=dict)  # more fields its response object echoes (/v1)
    completion: RawPrompt | None = None  # a plain completion: `items` is empty and no template is used
    logprobs: int | None = None  # report each output token's log probability and this many alternatives

    @cached_property
    def images(self) -> list[Media]:
        """The images and audio clips of the conversation, in the order the prompt holds them.

        Worked out once per request (a copy made with `dataclasses.replace` works it out again): the
        service asks five times before the first token, and a long history of 23,000 messages took 9 ms
        of the service's interpreter lock each time."""
        return [image for item in self.items if isinstance(item, Message) for image in item.images]

    @cached_property
    def text_chars(self) -> dict[str, int]:
        """Each role's characters of message text, trimmed as templates trim a message, over the messages
        without images or audio: what `serving.input_bounds.text_floor` counts."""
        chars: dict[str, int] = {}
        for item in self.items:
            if type(item) is Message and not item.images:
                chars[item.role] = chars.get(item.role, 0) + len(item.text.strip())
        return chars

    def settle(self) -> ResponseRequest:
        """Work out now what the service asks of a large request's items (`images`, `text_chars`), where
        its body is parsed: for a big body that is the worker process (`http.body_parser`), and the answers
        travel with the object instead of costing the service's interpreter lock a walk of 23,000 items
        each (about 5 ms). Returns the request."""
        if self.large:
            _ = (self.images, self.text_chars)  # cached properties: kept on the object, pickled with it
        return self

    @property
    def large(self) -> bool:
        """True when preparing this request (render, tokenize, grammar) belongs off the event loop."""
        return self.size >= LARGE_REQUEST_CHARS


def input_items(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's `input` as a list of item objects (a string becomes one user message)."""
    value = raw.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    items: list[dict[str, Any]] = []
    for item in value or []:
        if isinstance(item, dict) and "type" not in item and "role" in item:
            item = {**item, "type": "message"}
        items.append(item)
    return items


def items_size(items: list[Item]) -> int:
    """The characters of text, call arguments and tool outputs in `items`."""
    total = 0
    for i in items:  # a loop, not a generator per item: 23,000 messages in 4.5 ms, not 17
        if isinstance(i, Message):
            total += len(i.text) + (sum(len(image.data) for image in i.images) if i.images else 0)
        else:
            total += len(i.arguments) if isinstance(i, FunctionCall) else len(i.output)
    return total


def schema_size(schema: Any) -> int:
    return len(json.dumps(schema, separators=(",", ":"))) if schema else 0


def _part_text(part: InputTextPart | OutputTextPart | RefusalPart | InputImagePart | InputAudioPart) -> str:
    if isinstance(part, RefusalPart):
        return part.refusal
    return part.text if not isinstance(part, MEDIA_PARTS) else ""


def _with_images(role: str, content: list[Any], param: str) -> Message:
    """A message with `input_image` or `input_audio` parts: its text as llama-server renders parts, and its
    media."""
    parts: list[str | Media] = []
    for j, part in enumerate(content):
        if isinstance(part, InputAudioPart):
            parts.append(audio_from_base64(part.input_audio.data, part.input_audio.format, f"{param}[{j}]"))
        elif not isinstance(part, InputImagePart):
            parts.append(_part_text(part))
        elif part.image_url is None:
            raise InvalidRequest(
                "An input_image needs an image_url (a data: URL with base64 bytes); file_id is not supported.",
                param=f"{param}[{j}].image_url",
            )
        else:
            parts.append(from_url(part.image_url, f"{param}[{j}]"))
    if role != "user":
        raise InvalidRequest("Only user messages may hold images or audio.", param=param)
    text, images = join_parts(parts)
    return Message(role, text, images)


def parse_response_create(body: Any) -> ResponseRequest:
    """Validate a decoded JSON body into a `ResponseRequest`, or raise a typed LMSP error."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    raw_input = body.get("input")
    batched = isinstance(raw_input, list) and len(raw_input) > INPUT_BATCH
    try:
        edge = ResponseCreate.model_validate({**body, "input": []} if batched else body)
    except ValidationError as exc:
        raise request_error(exc) from None
    if batched:
        edge.input = _validate_input(ResponseCreate._input(raw_input))
    ext = edge.extensions.get("lmsp_tray")
    try:
        opts = LmspTrayOptions.model_validate(ext or {})
    except ValidationError as exc:
        raise request_error(exc, prefix=("extensions", "lmsp_tray")) from None
    if ext is not None and not isinstance(ext, dict):
        raise InvalidRequest("extensions.lmsp_tray must be an object.", param="extensions.lmsp_tray")

    items: list[Item] = []
    if edge.instructions:
        items.append(Message("system", edge.instructions))
    for n, item in enumerate(edge.input):
        if isinstance(item, PlainMessageItem):
            role = "system" if item.role == "developer" else item.role
            if isinstance(item.content, str):
                items.append(Message(role, item.content))
                continue
            if any(isinstance(p, MEDIA_PARTS) for p in item.content):
                items.append(_with_images(role, item.content, f"input[{n}].content"))
                continue
            text = "".join(_part_text(p) for p in item.content)
            items.append(Message(role, text))
        elif isinstance(item, FunctionCallItem):
            items.append(FunctionCall(item.call_id, item.name, item.arguments, item.id))
        elif isinstance(item, FunctionCallOutputItem):
            items.append(FunctionCallOutput(item.call_id, item.output))
        # reasoning items sent back are context the model does not need again

    fmt = edge.response_format
    if fmt is None and edge.text is not None:
        fmt = edge.text.format
    tool_choice: str | dict[str, str] = "auto"
    if isinstance(edge.tool_choice, NamedToolChoice):
        tool_choice = {"type": "function", "name": edge.tool_choice.name}
    elif edge.tool_choice is not None:
        tool_choice = edge.tool_choice

    json_schema = fmt.json_schema.schema_ if fmt is not None and fmt.json_schema is not None else None
    tools = [Tool(t.name, t.description, t.parameters) for t in edge.tools or []]
    size = (
        items_size(items)
        + sum(len(t.description or "") + schema_size(t.parameters) for t in tools)
        + schema_size(json_schema)
    )
    return ResponseRequest(
        model=edge.model,
        items=items,
        stream=edge.stream,
        max_output_tokens=edge.max_output_tokens,
        temperature=edge.temperature,
        top_p=opts.top_p if opts.top_p is not None else edge.top_p,
        top_k=opts.top_k,
        min_p=opts.min_p,
        seed=opts.seed,
        stop=list(opts.stop or []),
        repeat_penalty=opts.repeat_penalty,
        keep_alive=opts.keep_alive,
        reasoning=opts.reasoning,
        json_schema=json_schema,
        json_object=fmt is not None and fmt.type == "json_object",
        tools=tools,
        tool_choice=tool_choice,
        store=edge.store,
        previous_response_id=edge.previous_response_id,
        raw=body,
        input_items=input_items(body) if edge.store else [],
        size=size,
    ).settle()
