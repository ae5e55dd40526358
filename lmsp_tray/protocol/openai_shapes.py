"""Responses, output items, stream events and input items written the way OpenAI's clients read them.

Why: `/v1/responses` runs the same machinery as `/lmsp/v1/responses`, whose
objects are LMSP's; this module is the way out of `/v1` (`openai_requests` is
the way in). The store keeps LMSP's own shapes — a continued conversation reads
its turns back as the model saw them — and every answer of `/v1` passes
through an `OpenAIView` of the request's tools:

- a call of a namespace's function is a `function_call` with `name` and
  `namespace` apart (as Codex CLI routes it); a call of a custom tool is a
  `custom_tool_call` with its plain-text `input` (streamed as
  `response.custom_tool_call_input.delta` / `.done`);
- `error` is OpenAI's `{"code", "message"}`; `usage` carries both token details;
- stream events carry a `sequence_number` from 0 (`http.sse` writes them
  without `id:` lines, as OpenAI does: a `/v1` stream cannot be resumed, and a
  keep-alive comment can never look like an event to a client);
- the `error` event is OpenAI's `{"type": "error", "code", "message", "param"}`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.openai_requests import CUSTOM_INPUT, ToolMap, tool_map

MAX_INPUT_ITEMS_PAGE = 100
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def openai_error(problem: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's `{"code", "message"}` for an LMSP problem document (None stays None)."""
    if not problem:
        return None
    return {
        "code": problem.get("code") or "server_error",
        "message": problem.get("message") or problem.get("detail") or problem.get("title") or "",
    }


def _custom_input(arguments: str) -> str:
    """A custom tool's plain-text input from the arguments the model wrote (`{"input": "..."}`)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments  # cut short (max_output_tokens): the text as far as it got
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]
    return arguments


class OpenAIView:
    """LMSP objects of one request (or stored response) as OpenAI's clients read them."""

    def __init__(self, tools: ToolMap) -> None:
        self.tools = tools
        self._custom_items: set[str] = set()  # ids of open custom tool call items (a stream)
        self._sequence = 0

    @classmethod
    def of_response(cls, response: dict[str, Any]) -> OpenAIView:
        """The view of a stored response, from the tools it echoes."""
        return cls(tool_map(response.get("tools")))

    # -- objects ------------------------------------------------------------------------------
    def item(self, item: dict[str, Any]) -> dict[str, Any]:
        """An output item (or a call sent back as input) as OpenAI writes it."""
        if item.get("type") != "function_call":
            return item
        name = str(item.get("name", ""))
        if name in self.tools.custom:
            out = {
                "id": item.get("id"),
                "type": "custom_tool_call",
                "status": item.get("status", "completed"),
                "call_id": item.get("call_id"),
                "name": name,
                "input": _custom_input(str(item.get("arguments", ""))),
            }
            return out if out["id"] is not None else {k: v for k, v in out.items() if k != "id"}
        if name in self.tools.namespaced:
            namespace, inner = self.tools.namespaced[name]
            return {**item, "name": inner, "namespace": namespace}
        return item

    def response(self, response: dict[str, Any]) -> dict[str, Any]:
        out = dict(response)
        out["output"] = [self.item(i) for i in response.get("output") or []]
        out["error"] = openai_error(response.get("error"))
        usage = response.get("usage")
        if usage:
            out["usage"] = {
                **usage,
                "input_tokens_details": {"cached_tokens": 0, **(usage.get("input_tokens_details") or {})},
                "output_tokens_details": {"reasoning_tokens": 0, **(usage.get("output_tokens_details") or {})},
            }
        out.setdefault("parallel_tool_calls", True)
        out.setdefault("tool_choice", "auto")
        out.setdefault("tools", [])
        out.setdefault("metadata", {})
        return out

    def input_items(self, items: Iterable[dict[str, Any]], response_id: str) -> list[dict[str, Any]]:
        """A stored turn's input items, each with an id (stable: made from the response id and position)."""
        items = list(items)
        custom_calls = {
            i.get("call_id") for i in items if i.get("type") == "function_call" and i.get("name") in self.tools.custom
        }
        tail = response_id.split("_", 1)[-1]
        out: list[dict[str, Any]] = []
        for n, raw in enumerate(items):
            item = copy.deepcopy(raw)
            kind = item.get("type", "message")
            if kind == "message":
                item["type"] = "message"
                if isinstance(item.get("content"), str):
                    role = item.get("role")
                    part = "output_text" if role == "assistant" else "input_text"
                    item["content"] = [{"type": part, "text": item["content"]}]
                item.setdefault("status", "completed")
            elif kind == "function_call_output" and item.get("call_id") in custom_calls:
                item["type"] = "custom_tool_call_output"
            else:
                item = self.item(item)
            if not item.get("id"):
                item["id"] = f"{_ITEM_PREFIX.get(str(item.get('type')), 'item')}_{tail}{n:04d}"
            out.append(item)
        return out

    # -- events -------------------------------------------------------------------------------
    def event(self, event: Event) -> list[Event]:
        """The OpenAI events for one LMSP event (none, one, or two for a custom tool's input)."""
        data = dict(event.data)
        name = event.name
        if name == "error":
            problem = data.get("error") or {}
            return [
                self._event(
                    event,
                    "error",
                    {
                        "code": problem.get("code"),
                        "message": problem.get("message") or problem.get("detail"),
                        "param": problem.get("param"),
                    },
                )
            ]
        if isinstance(data.get("response"), dict):
            data["response"] = self.response(data["response"])
        if name == "response.failed":
            data.pop("error", None)  # OpenAI's event carries it in `response.error` only
        item = data.get("item")
        if isinstance(item, dict):
            data["item"] = self.item(item)
            if data["item"].get("type") == "custom_tool_call" and name == "response.output_item.added":
                self._custom_items.add(str(item.get("id")))
        item_id = data.get("item_id")
        if item_id in self._custom_items:
            if name == "response.function_call_arguments.delta":
                return []  # the input goes out whole with the `.done`: the JSON around it is not the client's
            if name == "response.function_call_arguments.done":
                self._custom_items.discard(item_id)
                text = _custom_input(str(data.get("arguments", "")))
                common = {"item_id": item_id, "output_index": data.get("output_index")}
                return [
                    self._event(event, "response.custom_tool_call_input.delta", {**common, "delta": text}),
                    self._event(event, "response.custom_tool_call_input.done", {**common, "input": text}),
                ]
        data.pop("type", None)
        data.pop("sequence_number", None)
        return [self._event(event, name, data)]

    def _event(self, source: Event, name: str, data: dict[str, Any]) -> Event:
        sequence = self._sequence
        self._sequence += 1
        return Event(source.id, name, {"type": name, "sequence_number": sequence, **data})

    async def events(self, source: AsyncIterator[Event]) -> AsyncIterator[Event]:
        async for event in source:
            for out in self.event(event):
                yield out

    def replayed(self, events: Iterable[Event]) -> list[Event]:
        return [out for event in events for out in self.event(event)]


def page(items: list[dict[str, Any]], *, order: str, after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's list object for one page of input items (`order` asc or desc, after an item id)."""
    ordered = items if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        ids = [i.get("id") for i in ordered]
        start = ids.index(after) + 1 if after in ids else len(ordered)
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
