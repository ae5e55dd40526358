"""The service's response events as OpenAI chat completion objects and stream chunks.

Why: a chat completion is produced by the same run as an LMSP response (one
engine, one parser, one assembler), so the two can never disagree; this
module only re-spells what the events say. Text deltas become
`delta.content`, thinking becomes `delta.reasoning_content` (as llama-server,
vLLM and DeepSeek's API send it), each function call becomes one entry of
`delta.tool_calls` — its `index`, `id`, `type` and `function.name` in the
first piece, its arguments in the pieces after — and the terminal event
becomes the chunk with `finish_reason` (`stop`, `length`, `tool_calls`),
then, with `stream_options.include_usage`, the usage chunk (`choices: []`).
A failure after the first chunk becomes OpenAI's in-stream error object
(`{"error": {...}}`), which the SDKs raise as `APIError`. `OpenAIChunks` and
`openai_object` hold what the chat and the legacy text completion shapes
(`openai_completions`) have in common.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from lmsp_tray.protocol.events import Event

CHUNK = "chat.completion.chunk"
# OpenAI's error `type` by HTTP status (the SDKs pick their exception class from the status itself).
_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    return _STATUS_TYPES.get(status, "server_error")


def chat_id(response_id: str) -> str:
    """`chatcmpl-…` from the response id (the same ULID, so logs and the activity view can be matched)."""
    return "chatcmpl-" + response_id.split("_", 1)[-1]


def openai_error(problem: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's error object for an LMSP problem document."""
    status = int(problem.get("status") or 500)
    return {
        "error": {
            "message": problem.get("detail") or problem.get("title") or "The request failed.",
            "type": error_type(status),
            "param": problem.get("param"),
            "code": problem.get("code"),
        }
    }


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's usage object (`prompt_tokens_details.cached_tokens`: the prompt reused from the KV cache)."""
    if not usage:
        return None
    out: dict[str, Any] = {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    out["prompt_tokens_details"] = {"cached_tokens": cached or 0}
    return out


def finish_reason(response: dict[str, Any]) -> str:
    if response.get("status") == "incomplete":
        return "length"
    if any(item.get("type") == "function_call" for item in response.get("output") or []):
        return "tool_calls"
    return "stop"


def _tool_call(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item.get("arguments", "")},
    }


def chat_completion(response: dict[str, Any]) -> dict[str, Any]:
    """A finished response object as a `chat.completion`."""
    logprobs: list[dict[str, Any]] | None = None
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                text.append(part.get("text", ""))
                if "logprobs" in part:
                    logprobs = (logprobs or []) + part["logprobs"]
        elif kind == "reasoning":
            reasoning.extend(p.get("text", "") for p in item.get("summary") or [])
        elif kind == "function_call":
            calls.append(_tool_call(item))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    message["refusal"] = None
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
        "finish_reason": finish_reason(response),
    }
    return openai_object(response, "chat.completion", chat_id(response["id"]), choice)


def openai_object(response: dict[str, Any], kind: str, object_id: str, choice: dict[str, Any]) -> dict[str, Any]:
    """A finished response as OpenAI's one-choice object of `kind` (`chat.completion`, `text_completion`)."""
    return {
        "id": object_id,
        "object": kind,
        "created": response.get("created_at", 0),
        "model": response.get("model"),
        "system_fingerprint": None,
        "choices": [choice],
        "usage": chat_usage(response.get("usage")),
    }


@dataclass
class OpenAIChunks:
    """What the chat and the text completion chunk writers share: the chunk envelope, the id and
    `created` taken from `response.created`, the finish and usage chunks, and the in-stream error.

    A subclass names its `OBJECT`, its id (`_object_id`) and its finish chunk (`_finish`), and turns
    the events in between into chunks of its own choice shape (`feed`)."""

    OBJECT: ClassVar[str] = ""

    model: str
    include_usage: bool = False
    id: str = ""
    created: int = 0
    _seq: int = 0

    def _object_id(self, response_id: str) -> str:
        raise NotImplementedError

    def _finish(self, response: dict[str, Any]) -> Event:
        """The chunk whose choice carries the `finish_reason` of the finished `response`."""
        raise NotImplementedError

    def _next(self, data: dict[str, Any]) -> Event:
        self._seq += 1
        return Event(self._seq, "chunk", data)

    def _envelope(self, choice: dict[str, Any] | None, **extra: Any) -> Event:
        """A chunk with one choice, or none (`choices: []`, the usage chunk)."""
        data: dict[str, Any] = {
            "id": self.id,
            "object": self.OBJECT,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [] if choice is None else [choice],
        }
        if self.include_usage:
            data["usage"] = None
        data.update(extra)
        return self._next(data)

    def _open(self, data: dict[str, Any]) -> None:
        """Take the chunks' id and `created` from the data of `response.created`."""
        response = data.get("response") or {}
        self.id = self._object_id(str(response.get("id") or data.get("response_id") or ""))
        self.created = int(response.get("created_at") or 0)

    def _close(self, event: Event) -> list[Event] | None:
        """The chunks a terminal event becomes (finish, usage; or OpenAI's error object); None for another event."""
        name, data = event.name, event.data
        if name in ("response.completed", "response.incomplete"):
            response = data.get("response") or {}
            chunks = [self._finish(response)]
            if self.include_usage:
                chunks.append(self._envelope(None, usage=chat_usage(data.get("usage") or response.get("usage"))))
            return chunks
        if name in ("response.failed", "error"):
            return [self._next(openai_error(data.get("error") or {}))]
        return None


@dataclass
class ChunkWriter(OpenAIChunks):
    """Turns one run's events into chat completion chunks (as `Event`s whose data is the chunk)."""

    OBJECT: ClassVar[str] = CHUNK

    _calls: dict[str, int] = field(default_factory=dict)  # output item id -> tool_calls index

    def _object_id(self, response_id: str) -> str:
        return chat_id(response_id)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> Event:
        return self._envelope({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})

    def _finish(self, response: dict[str, Any]) -> Event:
        return self._chunk({}, finish_reason(response))

    def feed(self, event: Event) -> list[Event]:
        """The chunks one event of the run becomes (often none)."""
        name, data = event.name, event.data
        if name == "response.created":
            self._open(data)
            return [self._chunk({"role": "assistant", "content": ""})]
        if name == "response.output_text.delta":
            if "logprobs" in data:
                return [
                    self._chunk({"content": data["delta"]}, logprobs={"content": data["logprobs"], "refusal": None})
                ]
            return [self._chunk({"content": data["delta"]})]
        if name == "response.reasoning_summary_text.delta":
            return [self._chunk({"reasoning_content": data["delta"]})]
        if name == "response.output_item.added" and data["item"].get("type") == "function_call":
            item = data["item"]
            index = self._calls.setdefault(item["id"], len(self._calls))
            first = {"index": index, **_tool_call(item)}
            return [self._chunk({"tool_calls": [first]})]
        if name == "response.function_call_arguments.delta":
            index = self._calls.get(data.get("item_id", ""), 0)
            return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": data["delta"]}}]})]
        return self._close(event) or []  # item bookkeeping and `response.cancelled` (nobody is reading): none


class Chunker(Protocol):
    def feed(self, event: Event) -> list[Event]:
        """The chunks one event of the run becomes."""
        ...


async def chat_chunks(events: AsyncIterator[Event], writer: Chunker) -> AsyncIterator[Event]:
    """The chunks of a run's events, ending after its terminal event."""
    async for event in events:
        for chunk in writer.feed(event):
            yield chunk
        if event.terminal:
            return
