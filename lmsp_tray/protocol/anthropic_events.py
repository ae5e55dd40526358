"""The service's response events as Anthropic's message object and stream events.

Why: a message is produced by the same run as an LMSP response (one engine,
one parser, one assembler), so the two can never disagree; this module only
re-spells what the events say, as Anthropic's SDKs and Claude Code read them:

- `response.created` → `message_start` (then a `ping`, as Anthropic sends);
- each output item → one content block: `content_block_start`, its deltas
  (`text_delta`, `thinking_delta` then a `signature_delta`, `input_json_delta`
  for a tool call's arguments), `content_block_stop`;
- the terminal event → `message_delta` (`stop_reason`, `stop_sequence`, the
  whole `usage`) and `message_stop`; a failure → Anthropic's `error` event.

`stop_reason`: `max_tokens` for a response cut by its limit (or the context
window), `tool_use` when the model called a tool, `stop_sequence` when one of
the request's stop sequences ended it (the engine says which), else
`end_turn`. `usage`: Anthropic counts the prompt read from the cache apart —
`input_tokens` is what was evaluated, `cache_read_input_tokens` what the
prompt cache gave back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from lmsp_tray.protocol.events import Event

# Anthropic's error `type` by HTTP status (its SDKs pick their exception class from the status itself).
_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    414: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    507: "overloaded_error",
    529: "overloaded_error",
}
PING: dict[str, Any] = {"type": "ping"}


def error_type(status: int) -> str:
    return _STATUS_TYPES.get(status, "api_error")


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def problem_error(problem: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's error object for an LMSP problem document (a failure after the stream began)."""
    return anthropic_error(
        int(problem.get("status") or 500), problem.get("detail") or problem.get("title") or "The request failed."
    )


def message_id(response_id: str) -> str:
    """`msg_…` from the response id (the same ULID, so logs and the activity view can be matched)."""
    return "msg_" + response_id.split("_", 1)[-1]


def tool_use_id(call_id: str) -> str:
    """`toolu_…` from a call id made here (an id sent back by the client is kept as it is)."""
    return "toolu_" + call_id.split("_", 1)[-1] if call_id.startswith("call_") else call_id


def signature(thinking: str) -> str:
    """The `signature` of a thinking block: a digest of its text (Anthropic's is a cryptographic seal the
    client sends back unread; a model here does not need it, so any stable value serves)."""
    return hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def usage(raw: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's usage: the evaluated prompt, the cached prompt, the output."""
    raw = raw or {}
    prompt = int(raw.get("input_tokens") or 0)
    cached = int((raw.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": int(raw.get("output_tokens") or 0),
    }


def stop_reason(response: dict[str, Any]) -> tuple[str, str | None]:
    """`stop_reason` and `stop_sequence` of a finished response."""
    if response.get("status") == "incomplete":
        return "max_tokens", None
    if any(item.get("type") == "function_call" for item in response.get("output") or []):
        return "tool_use", None
    matched = ((response.get("extensions") or {}).get("lmsp_tray") or {}).get("stop_sequence")
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is (`{}` when cut short before they closed)."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_block(item: dict[str, Any]) -> dict[str, Any] | None:
    """One finished output item as an Anthropic content block."""
    kind = item.get("type")
    if kind == "message":
        return {"type": "text", "text": "".join(p.get("text", "") for p in item.get("content") or [])}
    if kind == "reasoning":
        thinking = "".join(p.get("text", "") for p in item.get("summary") or [])
        return {"type": "thinking", "thinking": thinking, "signature": signature(thinking)}
    if kind == "function_call":
        return {
            "type": "tool_use",
            "id": tool_use_id(item["call_id"]),
            "name": item["name"],
            "input": _arguments(item.get("arguments", "")),
        }
    return None


def message(response: dict[str, Any], model: str) -> dict[str, Any]:
    """A finished response object as Anthropic's message object (`model`: the name asked for)."""
    reason, sequence = stop_reason(response)
    blocks = [b for b in (content_block(item) for item in response.get("output") or []) if b is not None]
    return {
        "id": message_id(str(response.get("id") or "")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(response.get("usage")),
    }


@dataclass
class MessageStream:
    """Turns one run's events into Anthropic's stream events (as `Event`s named as Anthropic names them)."""

    model: str  # the name asked for
    notes: dict[str, Any] = field(default_factory=dict)  # more fields of `message_start`'s message (this service's)
    _seq: int = 0
    _blocks: dict[int, int] = field(default_factory=dict)  # output index -> content block index
    _thinking: dict[int, list[str]] = field(default_factory=dict)  # a thinking block's text, for its signature

    def _next(self, data: dict[str, Any]) -> Event:
        self._seq += 1
        return Event(self._seq, str(data["type"]), data)

    def _start(self, data: dict[str, Any]) -> list[Event]:
        response = data.get("response") or {}
        start = {
            "id": message_id(str(response.get("id") or data.get("response_id") or "")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(None),
            **self.notes,
        }
        return [self._next({"type": "message_start", "message": start}), self._next(PING)]

    def _block_start(self, data: dict[str, Any]) -> list[Event]:
        item, index = data["item"], len(self._blocks)
        kind = item.get("type")
        if kind == "message":
            block: dict[str, Any] = {"type": "text", "text": ""}
        elif kind == "reasoning":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            self._thinking[index] = []
        elif kind == "function_call":
            block = {"type": "tool_use", "id": tool_use_id(item["call_id"]), "name": item["name"], "input": {}}
        else:
            return []
        self._blocks[int(data["output_index"])] = index
        return [self._next({"type": "content_block_start", "index": index, "content_block": block})]

    def _delta(self, data: dict[str, Any], delta: dict[str, Any]) -> list[Event]:
        index = self._blocks.get(int(data.get("output_index", -1)))
        if index is None:
            return []
        return [self._next({"type": "content_block_delta", "index": index, "delta": delta})]

    def _block_stop(self, data: dict[str, Any]) -> list[Event]:
        index = self._blocks.get(int(data.get("output_index", -1)))
        if index is None:
            return []
        events = []
        if index in self._thinking:
            sealed = {"type": "signature_delta", "signature": signature("".join(self._thinking.pop(index)))}
            events.append(self._next({"type": "content_block_delta", "index": index, "delta": sealed}))
        events.append(self._next({"type": "content_block_stop", "index": index}))
        return events

    def _finish(self, data: dict[str, Any]) -> list[Event]:
        response = data.get("response") or {}
        reason, sequence = stop_reason(response)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(data.get("usage") or response.get("usage")),
        }
        return [self._next(delta), self._next({"type": "message_stop"})]

    def feed(self, event: Event) -> list[Event]:
        """The stream events one event of the run becomes (often none)."""
        name, data = event.name, event.data
        if name == "response.created":
            return self._start(data)
        if name == "response.output_item.added":
            return self._block_start(data)
        if name == "response.output_text.delta":
            return self._delta(data, {"type": "text_delta", "text": data["delta"]})
        if name == "response.reasoning_summary_text.delta":
            index = self._blocks.get(int(data.get("output_index", -1)))
            if index in self._thinking:
                self._thinking[index].append(data["delta"])
            return self._delta(data, {"type": "thinking_delta", "thinking": data["delta"]})
        if name == "response.function_call_arguments.delta":
            return self._delta(data, {"type": "input_json_delta", "partial_json": data["delta"]})
        if name == "response.output_item.done":
            return self._block_stop(data)
        if name in ("response.completed", "response.incomplete"):
            return self._finish(data)
        if name in ("response.failed", "error"):
            return [self._next(problem_error(data.get("error") or {}))]
        return []  # part bookkeeping and `response.cancelled` (nobody is reading)
