"""LMSP response objects, output items and stream events, built exactly as PROFILE §1 says.

`ResponseAssembler` turns what a model produces (text, reasoning, function
call pieces) into the ordered list of semantic events of one response and the
final response object. The same events serve a direct SSE stream, a task's
event log and a sync response (which just keeps the final object), so the
three can never disagree. Event ids are integers from 1, strictly increasing.

`ResponseAssembler.resume` rebuilds an assembler from the events a response
already produced (a task's log cut short by a crash), so that ending it —
closing the item that was open, the terminal event, the final object — goes
through the very same code as a live response.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lmsp_tray.ids import new_id

TERMINAL_EVENTS = frozenset(
    {
        "response.completed",
        "response.incomplete",
        "response.failed",
        "response.cancelled",
        "error",
        # a model download task (`protocol.downloads`)
        "model.download.completed",
        "model.download.failed",
        "model.download.cancelled",
    }
)


@dataclass(frozen=True)
class Event:
    """One SSE event: integer id, event name, JSON data (which repeats `type` and `sequence_number`)."""

    id: int
    name: str
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.name in TERMINAL_EVENTS


def error_event(event_id: int, problem: dict[str, Any]) -> Event:
    """The `error` event: a problem not tied to one response (its stream could not go on)."""
    return Event(event_id, "error", {"type": "error", "sequence_number": event_id, "error": problem})


def usage(input_tokens: int, output_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """Token counts; `input_tokens_details.cached_tokens` says how much of the prompt came from the KV cache."""
    out: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    if cached_tokens is not None:
        out["input_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


_DELTAS = frozenset(
    {"response.output_text.delta", "response.reasoning_summary_text.delta", "response.function_call_arguments.delta"}
)


@dataclass
class _OpenItem:
    index: int
    item: dict[str, Any]
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None  # of a message's tokens, when the request asked for them


class ResponseAssembler:
    """Builds the events and the response object of one response as output arrives.

    Call `start()`, then `text()` / `reasoning()` / `function_call_*()` as the
    model produces them, then exactly one of `complete()`, `incomplete()`,
    `fail()`, `cancel()`. Each call returns the events it produced.
    """

    def __init__(
        self,
        model: str,
        *,
        response_id: str | None = None,
        created_at: int | None = None,
        first_event_id: int = 1,
        fields: dict[str, Any] | None = None,
    ) -> None:
        self.fields = dict(fields or {})  # more fields the response object carries (the request echoed on /v1)
        self.response_id = response_id or new_id("resp")
        self.model = model
        self.created_at = int(time.time()) if created_at is None else created_at
        self.status = "in_progress"
        self.output: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self._next_id = first_event_id
        self._open: _OpenItem | None = None
        self.started = False  # `response.created` is out

    @classmethod
    def resume(
        cls, events: Iterable[Event], model: str, *, response_id: str | None = None, created_at: int | None = None
    ) -> ResponseAssembler:
        """An assembler that continues the response these events (ids from 1, none terminal) began.

        ``model``, ``response_id`` and ``created_at`` are used when the events hold no
        `response.created` (then call `start()` first). The output item that was
        open when the events stop stays open, with the text its deltas carried.
        """
        asm = cls(model, response_id=response_id, created_at=created_at)
        for event in events:
            asm._replay(event)
        return asm

    def _replay(self, event: Event) -> None:
        if event.terminal:
            raise ValueError(f"{event.name} ended this response; there is nothing to resume")
        data = event.data
        self._next_id = event.id + 1
        if event.name == "response.created":
            response = data.get("response") or {}
            self.response_id = str(response.get("id") or data.get("response_id") or self.response_id)
            self.model = str(response.get("model") or self.model)
            self.created_at = int(response.get("created_at") or self.created_at)
            self.started = True
        elif event.name == "response.output_item.added":
            item = copy.deepcopy(data["item"])
            self.output.append(item)
            self._open = _OpenItem(len(self.output) - 1, item)
        elif event.name == "response.output_item.done":
            index = int(data["output_index"])
            self.output[index] = copy.deepcopy(data["item"])
            if self._open is not None and self._open.index == index:
                self._open = None
        elif event.name in _DELTAS and self._open is not None and self._open.index == data.get("output_index"):
            self._open.text.append(str(data.get("delta", "")))

    # -- the response object ------------------------------------------------------------------
    def response(self) -> dict[str, Any]:
        base = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": copy.deepcopy(self.output),
            "usage": dict(self.usage) if self.usage else None,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
        }
        if self.fields:
            base.update({k: copy.deepcopy(v) for k, v in self.fields.items() if k not in base})
        return base

    @property
    def finished(self) -> bool:
        return self.status != "in_progress"

    @property
    def output_text(self) -> str:
        return "".join(
            part.get("text", "")
            for item in self.output
            if item.get("type") == "message"
            for part in item.get("content", [])
        )

    # -- events -----------------------------------------------------------------------------------
    def _event(self, name: str, **data: Any) -> Event:
        eid = self._next_id
        self._next_id += 1
        payload = {"type": name, "sequence_number": eid, "response_id": self.response_id, **data}
        return Event(eid, name, payload)

    def start(self) -> list[Event]:
        self.started = True
        return [self._event("response.created", status="in_progress", response=self.response())]

    def text(self, delta: str, *, logprobs: list[dict[str, Any]] | None = None) -> list[Event]:
        """Append assistant message text (opens a message item if none is open); `logprobs`, OpenAI's
        `{token, logprob, bytes, top_logprobs}` of the tokens behind it, go with the delta and the part."""
        if not delta:
            return []
        events = self._ensure_open("message")
        assert self._open is not None
        self._open.text.append(delta)
        extra: dict[str, Any] = {}
        if logprobs is not None:
            self._open.logprobs = (self._open.logprobs or []) + logprobs
            extra["logprobs"] = logprobs
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._open.item["id"],
                output_index=self._open.index,
                content_index=0,
                delta=delta,
                **extra,
            )
        )
        return events

    def reasoning(self, delta: str) -> list[Event]:
        """Append reasoning (thinking) text; it becomes a `reasoning` item with a summary."""
        if not delta:
            return []
        events = self._ensure_open("reasoning")
        assert self._open is not None
        self._open.text.append(delta)
        events.append(
            self._event(
                "response.reasoning_summary_text.delta",
                item_id=self._open.item["id"],
                output_index=self._open.index,
                summary_index=0,
                delta=delta,
            )
        )
        return events

    def function_call_start(self, name: str) -> list[Event]:
        events = self.close_item()
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": new_id("call"),
            "name": name,
            "arguments": "",
        }
        events += self._open_item(item)
        return events

    def function_call_arguments(self, delta: str) -> list[Event]:
        if not delta or self._open is None or self._open.item["type"] != "function_call":
            return []
        self._open.text.append(delta)
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=self._open.item["id"],
                output_index=self._open.index,
                delta=delta,
            )
        ]

    def close_item(self, status: str = "completed") -> list[Event]:
        """Finish the open output item, if any, with `response.output_item.done`.

        `status` is `incomplete` for an item cut short by the output limit."""
        open_ = self._open
        if open_ is None:
            return []
        self._open = None
        item = open_.item
        text = "".join(open_.text)
        events: list[Event] = []
        if item["type"] == "message":
            item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
            if open_.logprobs is not None:
                item["content"][0]["logprobs"] = open_.logprobs
            events.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=open_.index,
                    content_index=0,
                    text=text,
                )
            )
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=open_.index,
                    content_index=0,
                    part=copy.deepcopy(item["content"][0]),
                )
            )
        elif item["type"] == "reasoning":
            item["summary"] = [{"type": "summary_text", "text": text}]
            events.append(
                self._event(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=open_.index,
                    summary_index=0,
                    text=text,
                )
            )
        elif item["type"] == "function_call":
            item["arguments"] = text
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=open_.index,
                    arguments=text,
                )
            )
        item["status"] = status
        self.output[open_.index] = item
        events.append(self._event("response.output_item.done", output_index=open_.index, item=copy.deepcopy(item)))
        return events

    def _ensure_open(self, kind: str) -> list[Event]:
        if self._open is not None and self._open.item["type"] == kind:
            return []
        events = self.close_item()
        if kind == "message":
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        else:
            item = {"id": new_id("rs"), "type": "reasoning", "summary": []}
        events += self._open_item(item)
        assert self._open is not None
        if kind == "message":
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._open.index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        return events

    def _open_item(self, item: dict[str, Any]) -> list[Event]:
        index = len(self.output)
        self.output.append(item)
        self._open = _OpenItem(index, item)
        return [self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item))]

    # -- terminal events --------------------------------------------------------------------------
    def complete(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        cached_tokens: int | None = None,
        stop_sequence: str | None = None,
    ) -> list[Event]:
        """`stop_sequence`: the request's stop string that ended the response, said in
        `extensions.lmsp_tray.stop_sequence` (Anthropic's `stop_reason: stop_sequence` reads it)."""
        if stop_sequence is not None:
            extensions = dict(self.fields.get("extensions") or {})
            extensions["lmsp_tray"] = {**(extensions.get("lmsp_tray") or {}), "stop_sequence": stop_sequence}
            self.fields["extensions"] = extensions
        events = self.close_item()
        self.status = "completed"
        self.usage = usage(input_tokens, output_tokens, cached_tokens)
        events.append(
            self._event("response.completed", status=self.status, usage=dict(self.usage), response=self.response())
        )
        return events

    def incomplete(
        self, reason: str, input_tokens: int, output_tokens: int, *, cached_tokens: int | None = None
    ) -> list[Event]:
        events = self.close_item("incomplete")
        self.status = "incomplete"
        self.usage = usage(input_tokens, output_tokens, cached_tokens)
        self.incomplete_details = {"reason": reason}
        events.append(
            self._event(
                "response.incomplete",
                status=self.status,
                incomplete_details=dict(self.incomplete_details),
                usage=dict(self.usage),
                response=self.response(),
            )
        )
        return events

    def fail(self, problem: dict[str, Any]) -> list[Event]:
        events = self.close_item()
        self.status = "failed"
        self.error = problem
        events.append(self._event("response.failed", status=self.status, error=problem, response=self.response()))
        return events

    def cancel(self) -> list[Event]:
        events = self.close_item()
        self.status = "cancelled"
        events.append(self._event("response.cancelled", status=self.status, response=self.response()))
        return events
