"""The service's response events as Ollama's `/api/chat` and `/api/generate` answers: NDJSON lines, or one object.

Why: an Ollama answer is produced by the same run as an LMSP or `/v1` one (one
engine, one parser, one assembler); this module only re-spells what the events say.
A text delta becomes `message.content` (chat) or `response` (generate), thinking
becomes `message.thinking` / `thinking`, each finished function call one
`message.tool_calls` entry with its arguments as an object (Ollama sends a call
whole, never in pieces), and the terminal event the last line: `done: true`,
`done_reason` (`stop`, `length`), the token counts and the durations in
nanoseconds. A failure after the first line is a last line `{"error": "…"}`, which
Ollama's clients raise. `stream: false` is the same lines folded into one object
(`fold`), so the two can never disagree.

The durations are measured here, around the run, as Ollama's clients use them:
`load_duration` from the request's arrival until its run started (finding and
loading the model, rendering and tokenizing the prompt), `prompt_eval_duration`
from then until the first output token, `eval_duration` from then to the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lmsp_tray.protocol.events import Event

CHAT = "chat"
GENERATE = "generate"
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error", "response.cancelled"})


def created_at(when: float | None = None) -> str:
    """RFC 3339 in UTC with a `Z`, as Ollama writes `created_at` and `modified_at`."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def error_text(error: Any) -> str:
    """The text of an error as Ollama writes it: a problem document's `detail`, or the text itself."""
    if isinstance(error, dict):
        return str(error.get("detail") or error.get("title") or "The request failed.")
    return str(error or "The request failed.")


@dataclass
class Clock:
    """When the request arrived, its run started and its first token came (`time.monotonic_ns`)."""

    arrived: int = field(default_factory=time.monotonic_ns)
    started: int | None = None
    first: int | None = None

    def start(self) -> None:
        self.started = time.monotonic_ns()

    def durations(self) -> dict[str, int]:
        end = time.monotonic_ns()
        started = self.started or self.arrived
        first = self.first or end
        return {
            "total_duration": end - self.arrived,
            "load_duration": started - self.arrived,
            "prompt_eval_duration": first - started,
            "eval_duration": end - first,
        }


def tool_call(item: dict[str, Any], index: int) -> dict[str, Any]:
    """A finished function call item as Ollama's `tool_calls` entry (arguments as an object)."""
    text = item.get("arguments") or "{}"
    try:
        arguments = json.loads(text)
    except ValueError:  # a model that wrote broken JSON outside a grammar: keep what it wrote
        arguments = {"_raw": text}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    return {"id": item.get("call_id"), "function": {"index": index, "name": item.get("name"), "arguments": arguments}}


@dataclass
class OllamaLines:
    """Turns one run's events into Ollama's lines (as `Event`s whose data is the line)."""

    kind: str  # CHAT or GENERATE
    model: str  # the name as asked
    clock: Clock = field(default_factory=Clock)
    _seq: int = 0
    _calls: int = 0

    def _line(self, name: str, **fields: Any) -> Event:
        self._seq += 1
        return Event(self._seq, name, {"model": self.model, "created_at": created_at(), **fields})

    def _piece(self, content: str = "", thinking: str | None = None, calls: list[Any] | None = None) -> Event:
        if self.kind == CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking is not None:
                message["thinking"] = thinking
            if calls is not None:
                message["tool_calls"] = calls
            return self._line("line", message=message, done=False)
        fields: dict[str, Any] = {"response": content}
        if thinking is not None:
            fields["thinking"] = thinking
        return self._line("line", **fields, done=False)

    def _first_token(self) -> None:
        if self.clock.first is None:
            self.clock.first = time.monotonic_ns()

    def feed(self, event: Event) -> list[Event]:
        """The lines one event of the run becomes (often none)."""
        name, data = event.name, event.data
        if name == "response.output_text.delta":
            self._first_token()
            return [self._piece(data["delta"])] if data["delta"] else []
        if name == "response.reasoning_summary_text.delta":
            self._first_token()
            return [self._piece("", thinking=data["delta"])]
        if name == "response.output_item.done" and data["item"].get("type") == "function_call":
            self._first_token()
            call = tool_call(data["item"], self._calls)
            self._calls += 1
            return [self._piece("", calls=[call])]
        if name in ("response.completed", "response.incomplete"):
            return [self._done(name, data)]
        if name in ("response.failed", "error"):
            error = data.get("error") or (data.get("response") or {}).get("error")
            self._seq += 1
            return [Event(self._seq, name, {"error": error_text(error)})]
        return []

    def _done(self, name: str, data: dict[str, Any]) -> Event:
        response = data.get("response") or {}
        use = data.get("usage") or response.get("usage") or {}
        reason = "length" if name == "response.incomplete" else "stop"
        last = self._piece("").data
        return Event(
            self._seq + 1,
            name,
            {
                **last,
                "done": True,
                "done_reason": reason,
                **self.clock.durations(),
                "prompt_eval_count": int(use.get("input_tokens") or 0),
                "eval_count": int(use.get("output_tokens") or 0),
            },
        )


def fold(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """`stream: false`: the lines as one object — the texts joined, the calls gathered, the last line's counters."""
    if not lines:
        return {}
    out = dict(lines[-1])
    if "error" in out:
        return out
    content = "".join((ln.get("message") or {}).get("content", "") for ln in lines)
    thinking = "".join((ln.get("message") or {}).get("thinking", "") for ln in lines)
    calls = [c for ln in lines for c in (ln.get("message") or {}).get("tool_calls") or []]
    if "message" in out:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        out["message"] = message
    else:
        out["response"] = "".join(ln.get("response", "") for ln in lines)
        generated = "".join(ln.get("thinking", "") for ln in lines)
        if generated:
            out["thinking"] = generated
    return out


async def ollama_lines(events: AsyncIterator[Event], writer: OllamaLines) -> AsyncIterator[Event]:
    """The lines of a run's events, ending after its terminal event."""
    async for event in events:
        for line in writer.feed(event):
            yield line
        if event.name in _TERMINAL:
            return
