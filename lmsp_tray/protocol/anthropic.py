"""Anthropic Messages requests (`POST /v1/messages`): validated at the edge, turned into the service's request.

Why: Claude Code speaks nothing else, and Anthropic's SDKs and the apps built
on them speak it first. A message request is the same work as a chat
completion with another spelling — `system` apart from `messages`, content as
blocks (`text`, `tool_use`, `tool_result`, `thinking`), tools with
`input_schema`, `max_tokens` required — so this module validates the body
(pydantic, liberal where clients differ harmlessly: unknown fields and
`cache_control` are ignored) and converts it into a `ResponseRequest`; the
same scheduler, chat templates, grammars for tool calls and reasoning parser
then run it. `anthropic_events` turns the run's events back into Anthropic's.

What the model does not see, and why:
- `thinking` / `redacted_thinking` blocks sent back (context the model does
  not need again, as reasoning items on `/v1/responses`);
- tools Anthropic defines and runs itself or whose schema only Anthropic's
  models know (`web_search_…`, `code_execution_…`, `bash_…`,
  `text_editor_…`, `computer_…`, …: every tool without an `input_schema`):
  left out, and named in the answer (`AnthropicRequest.left_out`), as
  `/v1/responses` does for OpenAI's hosted tools; blocks of such tools in the
  history (`server_tool_use`, `web_search_tool_result`, …) are dropped.

Images (`image` blocks with a base64 `source`) go to a model that takes them; a `url` source is
refused (the service fetches nothing), as are documents (400).

Claude Code's system prompt begins with `x-anthropic-billing-header: …;
cch=<hash>;`, a stamp that changes on every request: at the very start of the
prompt it would leave the prompt cache nothing to reuse. `normalize_billing_header`
pins it, as llama-server's `normalize_anthropic_billing_header` does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.images import ImageInput, from_base64, join_parts
from lmsp_tray.protocol.requests import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    ResponseRequest,
    Tool,
    check_stop_list,
    items_size,
)
from lmsp_tray.protocol.validation import validated

BILLING_HEADER = "x-anthropic-billing-header:"
# The `key=value;` attributes right after the billing header's name (`cc_version=2.1.101.e51; cch=a5145;`).
_ATTRIBUTE = re.compile(r"\s*([A-Za-z_]+)=([^;\s]*);")
_UNREADABLE = frozenset({"document", "search_result", "container_upload"})
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def normalize_billing_header(system: str) -> str:
    """`system` with Claude Code's per-request billing stamp pinned, so the prompt's prefix stays the same.

    The value of `cch=` becomes as many `f`s (llama-server's rule), and so does what follows the third
    dotted part of `cc_version=` (newer Claude Code releases stamp the version itself). Only the
    attributes right after a header at the very start of the text are touched; any other text is
    returned as it is."""
    if not system.startswith(BILLING_HEADER):
        return system
    out = [BILLING_HEADER]
    at = len(BILLING_HEADER)
    while (match := _ATTRIBUTE.match(system, at)) is not None:
        key, value = match.group(1), match.group(2)
        if key == "cch":
            value = "f" * len(value)
        elif key == "cc_version":
            parts = value.split(".")
            if len(parts) > 3:
                value = ".".join(parts[:3] + ["f" * len(p) for p in parts[3:]])
        out.append(system[at : match.start(2)] + value + ";")
        at = match.end()
    return "".join(out) + system[at:]


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Edge):
    type: Literal["text"]
    text: str


class ThinkingBlock(_Edge):
    type: Literal["thinking"]
    thinking: str = ""
    signature: str | None = None


class RedactedThinkingBlock(_Edge):
    type: Literal["redacted_thinking"]
    data: str = ""


class ToolUseBlock(_Edge):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Edge):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None


class ImageSource(_Edge):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Edge):
    type: Literal["image"]
    source: ImageSource


Block = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock | ImageBlock,
    Field(discriminator="type"),
]


class _Unreadable(ValueError):
    def __init__(self, kind: str, index: int) -> None:
        super().__init__(kind)
        self.kind = kind
        self.index = index


def _known_blocks(value: Any) -> Any:
    """Content blocks with those of server tools dropped; images and documents refused."""
    if not isinstance(value, list):
        return value
    kept: list[Any] = []
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind in _UNREADABLE:
            raise _Unreadable(kind, i)
        if isinstance(kind, str) and (kind == "server_tool_use" or kind.endswith("_tool_result")):
            continue  # a tool Anthropic ran: the service never produced it (see the module docstring)
        if isinstance(block, dict) and kind == "tool_result" and isinstance(block.get("content"), list):
            for inner in block["content"]:
                inner_kind = inner.get("type") if isinstance(inner, dict) else None
                if isinstance(inner_kind, str) and (inner_kind in _UNREADABLE or inner_kind == "image"):
                    raise _Unreadable(inner_kind, i)
        kept.append(block)
    return kept


class MessageParam(_Edge):
    role: Literal["user", "assistant", "system"]  # system: an instruction between turns (Claude Code 2.1 sends one)
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        return _known_blocks(value)


class ToolChoice(_Edge):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Edge):
    type: str = Field(min_length=1)  # enabled, disabled; adaptive and newer kinds: the model's own default
    budget_tokens: int | None = Field(default=None, ge=1)  # not enforced: the model thinks until it is done


class OutputFormat(_Edge):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Edge):
    format: OutputFormat | None = None  # structured output, grammar-constrained as `response_format` elsewhere
    effort: str | None = None  # ignored


class MessageCreate(_Edge):
    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None  # ignored (Anthropic's user id for abuse detection)

    @field_validator("stop_sequences", mode="before")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        return check_stop_list(value)


class CountTokens(MessageCreate):
    max_tokens: int = 1  # not part of a count_tokens request


@dataclass
class AnthropicRequest:
    """A validated message request: the service's request and what only Anthropic's shapes need."""

    request: ResponseRequest
    model: str  # the name asked for: the answer's `model`, whatever local model it resolves to
    thinking: bool | None = None  # `thinking.type`: enabled (True), disabled (False), else the model's own
    left_out: list[dict[str, Any]] = field(default_factory=list)  # {"index", "type", "name"} of each server tool


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(block.text for block in content)


def _image(block: ImageBlock, role: str, param: str) -> ImageInput:
    if role != "user":
        raise InvalidRequest("Only user messages may hold images.", param=param)
    if block.source.type != "base64":
        raise InvalidRequest(
            "Image URLs are not fetched: this local service does not make requests elsewhere. Send the image's "
            "bytes instead (source.type 'base64').",
            param=f"{param}.source",
        )
    return from_base64(block.source.data or "", param)


def _message(role: str, parts: list[str | ImageInput]) -> Message:
    if not any(isinstance(p, ImageInput) for p in parts):
        return Message(role, "\n".join(p for p in parts if isinstance(p, str)))
    text, images = join_parts(parts)
    return Message(role, text, images)


def _blocks(role: str, blocks: list[Any], param: str) -> list[Item]:
    """One message's blocks as items, in order (consecutive text and image blocks are one message; a tool
    result marked `is_error` says so to the model)."""
    items: list[Item] = []
    text: list[str | ImageInput] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text.append(block.text)
            continue
        if isinstance(block, ImageBlock):
            text.append(_image(block, role, f"{param}[{j}]"))
            continue
        if not isinstance(block, ToolUseBlock | ToolResultBlock):
            continue  # thinking and redacted_thinking blocks: context the model does not need again
        if text:
            items.append(_message(role, text))
            text = []
        if isinstance(block, ToolUseBlock):
            items.append(FunctionCall(block.id, block.name, json.dumps(block.input, ensure_ascii=False)))
        else:
            output = _text(block.content)
            items.append(FunctionCallOutput(block.tool_use_id, f"Error: {output}" if block.is_error else output))
    if text:
        items.append(_message(role, text))
    return items


def _items(system: str | list[TextBlock] | None, messages: list[MessageParam]) -> list[Item]:
    """System and messages as the service's items."""
    items: list[Item] = []
    if system:
        items.append(Message("system", normalize_billing_header(_text(system))))
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            items.append(Message(message.role, message.content))
        else:
            items += _blocks(message.role, message.content, f"messages[{i}].content")
    return items


def _tools(tools: list[dict[str, Any]] | None) -> tuple[list[Tool], list[dict[str, Any]]]:
    """The tools the model is offered (those with an `input_schema`) and those left out (Anthropic's own)."""
    offered: list[Tool] = []
    left_out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools or []):
        name = tool.get("name")
        kind = tool.get("type")
        if "input_schema" not in tool or kind not in (None, "custom"):
            left_out.append(
                {"index": i, "type": kind or "unknown", **({"name": name} if isinstance(name, str) else {})}
            )
            continue
        schema = tool.get("input_schema")
        description = tool.get("description")
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise InvalidRequest(f"'tools[{i}].name' must be a name of 1 to 128 characters.", param=f"tools[{i}].name")
        if not isinstance(schema, dict):
            raise InvalidRequest(f"'tools[{i}].input_schema' must be a JSON Schema object.", param=f"tools[{i}]")
        if description is not None and not isinstance(description, str):
            raise InvalidRequest(f"'tools[{i}].description' must be a string.", param=f"tools[{i}].description")
        offered.append(Tool(name, description, schema or NO_PARAMETERS))
    return offered, left_out


def _tool_choice(choice: ToolChoice | None, offered: list[Tool]) -> str | dict[str, str]:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "none":
        return "none"
    if not offered:
        raise InvalidRequest(
            f"'tool_choice' is '{choice.type}' but no tool the model can call was sent (tools Anthropic runs "
            "itself are not run here).",
            param="tool_choice",
        )
    if choice.type == "any":
        return "required"
    if not choice.name:
        raise InvalidRequest("'tool_choice.name' is required when its type is 'tool'.", param="tool_choice.name")
    return {"type": "function", "name": choice.name}


def parse_message_create(body: Any, edge_model: type[MessageCreate] = MessageCreate) -> AnthropicRequest:
    """Validate a decoded `POST /v1/messages` body, or raise a typed error naming the field."""
    edge = _validated(edge_model, body)
    tools, left_out = _tools(edge.tools)
    items = _items(edge.system, edge.messages)
    kind = edge.thinking.type if edge.thinking is not None else None
    thinking = True if kind == "enabled" else False if kind == "disabled" else None
    fmt = edge.output_config.format if edge.output_config is not None else None
    json_schema = (fmt.schema_ or {"type": "object"}) if fmt is not None else None
    size = (
        items_size(items)
        + sum(len(t.description or "") + len(json.dumps(t.parameters)) for t in tools)
        + (len(json.dumps(json_schema)) if json_schema else 0)
    )
    request = ResponseRequest(
        model=edge.model,
        items=items,
        stream=edge.stream,
        max_output_tokens=edge.max_tokens,
        clamp_output=True,  # Anthropic's max_tokens is a ceiling; the context window may hold less
        temperature=edge.temperature,
        top_p=edge.top_p,
        top_k=edge.top_k,
        stop=list(edge.stop_sequences or []),
        reasoning=thinking,
        json_schema=json_schema,
        tools=tools,
        tool_choice=_tool_choice(edge.tool_choice, tools),
        raw=body,
        size=size,
    ).settle()
    return AnthropicRequest(request, model=edge.model, thinking=thinking, left_out=left_out)


def parse_count_tokens(body: Any) -> AnthropicRequest:
    """A `POST /v1/messages/count_tokens` body: a message request without `max_tokens`."""
    return parse_message_create(body, CountTokens)


def _validated(edge_model: type[MessageCreate], body: Any) -> MessageCreate:
    """`body` validated as `edge_model`; an image or document block is refused as such, any other fault
    is a 400 naming the field (`validated`)."""
    if isinstance(body, dict):
        try:
            return edge_model.model_validate(body)
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                ctx_error = (err.get("ctx") or {}).get("error")
                if isinstance(ctx_error, _Unreadable):
                    loc = tuple(err.get("loc") or ())
                    message = loc[1] if len(loc) > 1 else 0
                    raise UnsupportedCapability(
                        f"Content of type '{ctx_error.kind}' cannot be read: the models this service runs take "
                        "text only.",
                        param=f"messages[{message}].content[{ctx_error.index}]",
                    ) from None
    return validated(edge_model, body)
