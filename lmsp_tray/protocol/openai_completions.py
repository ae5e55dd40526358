"""OpenAI legacy Completions (`POST /v1/completions`): plain text continuation and fill-in-the-middle.

Why: code-completion clients (Continue's tab autocomplete, Tabby-style
plugins, llama.vim-like editors) send `prompt` + `suffix` and expect the
middle back; others continue a raw prompt with no chat template. Both run as
a `ResponseRequest` whose `completion` holds the raw prompt (the service
tokenizes it as it is, or with the model's FIM tokens), so they share the
scheduler, batching, prefix reuse and cancellation with every other request.
The answer is a `text_completion` object, or its chunks (then `data: [DONE]`).

Refused with 400: `n` or `best_of` other than 1, `echo` with a `suffix`,
several prompts in one request. `logprobs` (0–5 alternatives) comes in the
legacy shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.openai_chunks import OpenAIChunks, openai_object
from lmsp_tray.protocol.openai_sampling import lmsp_options, sampling
from lmsp_tray.protocol.requests import RawPrompt, ResponseRequest, check_stop_list
from lmsp_tray.protocol.validation import validated

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions (editors send their own)


class CompletionCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    prompt: str | list[str]
    suffix: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    echo: bool = False
    n: int | None = Field(default=None, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    extensions: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        return check_stop_list(value)


@dataclass
class CompletionRequest:
    request: ResponseRequest
    include_usage: bool = False
    echo: str = ""  # text to put before the output (`echo`)


def parse_completion_create(body: Any) -> CompletionRequest:
    """Validate a decoded `POST /v1/completions` body, or raise a typed error naming the field."""
    edge = validated(CompletionCreate, body)
    for name in ("n", "best_of"):
        value = getattr(edge, name)
        if value is not None and value != 1:
            raise InvalidRequest(f"'{name}' must be 1: this service returns one choice per request.", param=name)
    prompt = edge.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequest(
                "'prompt' must be one string (or a list of one): send one request per prompt.", param="prompt"
            )
        prompt = prompt[0]
    if edge.echo and edge.suffix is not None:
        raise InvalidRequest("'echo' cannot be combined with 'suffix'.", param="echo")
    opts = lmsp_options(edge.extensions)
    include_usage = bool(edge.stream and (edge.stream_options or {}).get("include_usage"))
    request = ResponseRequest(
        model=edge.model,
        items=[],
        stream=edge.stream,
        max_output_tokens=edge.max_tokens,
        **sampling(edge, opts),
        raw=body,
        size=len(prompt) + len(edge.suffix or ""),
        completion=RawPrompt(prompt, edge.suffix),
        logprobs=edge.logprobs,
    )
    return CompletionRequest(request, include_usage=include_usage, echo=prompt if edge.echo else "")


def completion_id(response_id: str) -> str:
    return "cmpl-" + response_id.split("_", 1)[-1]


def legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """Chat-style `{token, logprob, top_logprobs}` entries in the completions shape; `offset` is where the
    first token's text starts in the choice's text."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [_top(e["top_logprobs"]) for e in entries],
        "text_offset": offsets,
    }


def _top(alternatives: list[dict[str, Any]]) -> dict[str, float]:
    """`{token text: logprob}`, most likely first; of two tokens with the same text (byte pieces of one
    character) the likelier is kept."""
    top: dict[str, float] = {}
    for alt in alternatives:
        top.setdefault(alt["token"], alt["logprob"])
    return top


def _reason(response: dict[str, Any]) -> str:
    return "length" if response.get("status") == "incomplete" else "stop"


def text_completion(response: dict[str, Any], *, echo: str = "") -> dict[str, Any]:
    """A finished response object as a `text_completion`."""
    parts = [
        part
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
    ]
    text = "".join(part.get("text", "") for part in parts)
    entries = [entry for part in parts for entry in part.get("logprobs") or []]
    asked = any("logprobs" in part for part in parts)
    choice = {
        "text": echo + text,
        "index": 0,
        "logprobs": legacy_logprobs(entries, len(echo)) if asked else None,
        "finish_reason": _reason(response),
    }
    return openai_object(response, "text_completion", completion_id(response["id"]), choice)


@dataclass
class CompletionChunks(OpenAIChunks):
    """Turns one run's events into `text_completion` chunks (as `Event`s whose data is the chunk)."""

    OBJECT: ClassVar[str] = "text_completion"

    echo: str = ""
    _offset: int = field(default=0)  # characters of the choice's text sent so far

    def _object_id(self, response_id: str) -> str:
        return completion_id(response_id)

    def _chunk(self, text: str, finish: str | None = None, logprobs: Any = None) -> Event:
        return self._envelope({"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish})

    def _finish(self, response: dict[str, Any]) -> Event:
        return self._chunk("", _reason(response))

    def feed(self, event: Event) -> list[Event]:
        name, data = event.name, event.data
        if name == "response.created":
            self._open(data)
            self._offset = len(self.echo)
            return [self._chunk(self.echo)] if self.echo else []
        if name == "response.output_text.delta":
            start, self._offset = self._offset, self._offset + len(data["delta"])
            if "logprobs" in data:
                return [self._chunk(data["delta"], logprobs=legacy_logprobs(data["logprobs"], start))]
            return [self._chunk(data["delta"])]
        return self._close(event) or []
