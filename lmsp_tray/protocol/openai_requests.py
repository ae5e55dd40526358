"""`POST /v1/responses` bodies as OpenAI's clients send them, turned into the service's own request.

Why a module of its own: `/lmsp/v1` keeps LMSP's rules exactly, while the
OpenAI-compatible `/v1/responses` runs the same machinery with OpenAI's
defaults where the two differ. This module is the whole difference on the way
in; `openai_shapes` is the way out. It rewrites the body into one the LMSP
parser (`requests.parse_response_create`) accepts, so validation, sizes and
error params stay the same code:

- `store` defaults to true (OpenAI's default; agents send `previous_response_id` without it);
- tools: `function` tools as they are; a `namespace` tool (a named group of
  function tools, as Codex CLI sends) offers each of its functions to the model
  under the flat name `<namespace>__<name>` (Codex's own flat form), and its
  calls go back split into `name` + `namespace`; a `custom` tool with a
  plain-text format becomes a function taking one string, `input`, and its
  calls go back as `custom_tool_call` items; every other type is a hosted tool
  the service cannot run (`web_search`, `file_search`, `code_interpreter`,
  `image_generation`, `mcp`, `computer_use_preview`, …): it is left out of
  what the model sees, and the response says which were left out;
- `tool_choice` `{"type": "allowed_tools", "mode", "tools"}` offers only those
  tools (with `mode` as the choice); a named `custom` tool is a named function;
  forcing a hosted tool is refused;
- `reasoning.effort: "none"` turns thinking off (`extensions.lmsp_tray.reasoning: false`);
- input items the model never produced here (hosted tool calls) are dropped;
  `custom_tool_call` / `custom_tool_call_output` and namespaced
  `function_call` items are rewritten as the model saw them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.requests import ResponseRequest, parse_response_create

CUSTOM_INPUT = "input"  # the one string argument a custom (freeform) tool's function takes
CUSTOM_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as plain text."}},
    "required": [CUSTOM_INPUT],
    "additionalProperties": False,
}
# Items of hosted tools a client may send back in `input`: the service never produced them and cannot
# show them to the model as what they were, so they are left out of the context.
HOSTED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "computer_call",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
        "compaction",
    }
)
ECHOED_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "temperature": None,
    "top_p": None,
    "max_output_tokens": None,
    "previous_response_id": None,
    "reasoning": None,
    "truncation": "disabled",
    "metadata": {},
}


MAX_TOOL_NAME = 64  # what `tools[].name` may hold (OpenAI's limit and the chat templates')


def flat_name(namespace: str, name: str) -> str:
    """The name the model sees for function `name` of namespace `namespace` (Codex's flat form).

    A flat name over 64 characters keeps its first 55 and a digest of the whole, so every
    function of a long namespace still has a distinct, stable name (the `ToolMap` maps it back)."""
    flat = f"{namespace.rstrip('_')}__{name.lstrip('_')}"
    if len(flat) <= MAX_TOOL_NAME:
        return flat
    return f"{flat[: MAX_TOOL_NAME - 9]}_{hashlib.sha256(flat.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class ToolMap:
    """What the model's tool names mean to the client: namespaced and custom tools, and those left out."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat name -> (namespace, name)
    custom: frozenset[str] = frozenset()
    left_out: tuple[dict[str, Any], ...] = ()  # {"index", "type"[, "name"]} of each hosted tool

    def call_name(self, namespace: str | None, name: str) -> str:
        return flat_name(namespace, name) if namespace else name


def tool_map(tools: Any) -> ToolMap:
    """The `ToolMap` of a `tools` list as sent (also rebuilt from a stored response's echoed tools)."""
    namespaced: dict[str, tuple[str, str]] = {}
    custom: set[str] = set()
    left_out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function":
            continue
        if kind == "namespace":
            space = str(tool.get("name") or "")
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    namespaced[flat_name(space, inner["name"])] = (space, inner["name"])
        elif kind == "custom" and _plain_text(tool):
            custom.add(str(tool.get("name")))
        else:
            entry: dict[str, Any] = {"index": i, "type": kind}
            if isinstance(tool.get("name"), str):
                entry["name"] = tool["name"]
            elif isinstance(tool.get("server_label"), str):
                entry["name"] = tool["server_label"]
            left_out.append(entry)
    return ToolMap(namespaced, frozenset(custom), tuple(left_out))


def _plain_text(tool: dict[str, Any]) -> bool:
    fmt = tool.get("format")
    return fmt is None or (isinstance(fmt, dict) and fmt.get("type", "text") == "text")


def _function_tools(tools: Any) -> list[dict[str, Any]]:
    """The function tools the model is offered, in order (a namespace's functions under their flat names)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array of tool objects.", param="tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'tools[{i}]' must be an object.", param=f"tools[{i}]")
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool))
        elif kind == "namespace":
            space = tool.get("name")
            inner_tools = tool.get("tools")
            if not isinstance(space, str) or not space or not isinstance(inner_tools, list):
                raise InvalidRequest(
                    f"'tools[{i}]' (a namespace) needs a 'name' and a 'tools' array of function tools.",
                    param=f"tools[{i}]",
                )
            for j, inner in enumerate(inner_tools):
                if not isinstance(inner, dict) or inner.get("type", "function") != "function":
                    raise InvalidRequest(
                        f"'tools[{i}].tools[{j}]' must be a function tool.", param=f"tools[{i}].tools[{j}]"
                    )
                if not isinstance(inner.get("name"), str):
                    raise InvalidRequest(f"'tools[{i}].tools[{j}].name' is required.", param=f"tools[{i}].tools[{j}]")
                out.append(_function({**inner, "name": flat_name(space, inner["name"])}))
        elif kind == "custom":
            if not _plain_text(tool):
                fmt = tool.get("format")
                syntax = fmt.get("type") if isinstance(fmt, dict) else fmt
                raise UnsupportedCapability(
                    f"Custom tool '{tool.get('name')}' has a '{syntax}' format; this service runs custom tools "
                    "with a plain-text format only.",
                    param=f"tools[{i}].format",
                )
            description = tool.get("description")
            out.append(
                {
                    "type": "function",
                    "name": tool.get("name"),
                    "description": description if isinstance(description, str) else None,
                    "parameters": CUSTOM_PARAMETERS,
                }
            )
    return out


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in tool.items() if k in ("type", "name", "description", "parameters", "strict")}
    out["type"] = "function"
    if out.get("parameters") is None:  # OpenAI's SDKs send null for a function without parameters
        out.pop("parameters", None)
    if out.get("description") is None:
        out.pop("description", None)
    if out.get("strict") is None:
        out.pop("strict", None)
    return out


def _tool_choice(choice: Any, offered: list[dict[str, Any]], tools: ToolMap) -> tuple[Any, list[dict[str, Any]]]:
    """The LMSP `tool_choice` and the tools offered for an OpenAI `tool_choice`."""
    if choice is None or isinstance(choice, str):
        return choice, offered
    if not isinstance(choice, dict):
        raise InvalidRequest("'tool_choice' must be a string or an object.", param="tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if isinstance(choice.get("namespace"), str) and isinstance(name, str):
            name = flat_name(choice["namespace"], name)
        return {"type": "function", "name": name}, offered
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise InvalidRequest("'tool_choice.mode' must be 'auto' or 'required'.", param="tool_choice.mode")
        allowed = choice.get("tools")
        if not isinstance(allowed, list):
            raise InvalidRequest("'tool_choice.tools' must be an array of tools.", param="tool_choice.tools")
        names: set[str] = set()
        spaces: set[str] = set()
        for entry in allowed:
            if not isinstance(entry, dict):
                continue
            if entry.get("type") == "namespace" and isinstance(entry.get("name"), str):
                spaces.add(entry["name"])
            elif isinstance(entry.get("name"), str):
                space = entry.get("namespace")
                names.add(flat_name(space, entry["name"]) if isinstance(space, str) else entry["name"])
        kept = [
            t
            for t in offered
            if t["name"] in names or (t["name"] in tools.namespaced and tools.namespaced[t["name"]][0] in spaces)
        ]
        if mode == "required" and not kept:
            raise InvalidRequest(
                "'tool_choice' requires a call to one of its allowed tools, and none of them is a function, "
                "namespace or custom tool among 'tools' (hosted tools are not run here).",
                param="tool_choice.tools",
            )
        return (mode if kept else "none"), kept
    raise UnsupportedCapability(
        f"'tool_choice' forces the hosted tool '{kind}', which this service cannot run; "
        "use 'auto', 'required', 'none', a function, a custom tool or 'allowed_tools'.",
        param="tool_choice",
    )


def _input(value: Any, tools: ToolMap) -> Any:
    """`input` with items rewritten as the model sees them (see the module docstring)."""
    if not isinstance(value, list):
        return value
    items: list[Any] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            items.append(item)
            continue
        kind = item.get("type")
        if kind in HOSTED_ITEMS:
            continue
        if kind == "item_reference":
            raise UnsupportedCapability(
                "Input item references are not supported; send the item itself, or continue with "
                "'previous_response_id'.",
                param=f"input[{i}]",
            )
        if kind == "function_call" and isinstance(item.get("namespace"), str) and isinstance(item.get("name"), str):
            item = {**item, "name": flat_name(item["namespace"], item["name"])}
        elif kind == "custom_tool_call":
            text = item.get("input")
            if not isinstance(text, str):
                raise InvalidRequest(f"'input[{i}].input' must be a string.", param=f"input[{i}].input")
            item = {
                "type": "function_call",
                "call_id": item.get("call_id"),
                "name": item.get("name"),
                "arguments": json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False),
                **({"id": item["id"]} if isinstance(item.get("id"), str) else {}),
            }
        elif kind == "custom_tool_call_output":
            item = {"type": "function_call_output", "call_id": item.get("call_id"), "output": item.get("output")}
        items.append(item)
    return items


def _reasoning_off(body: dict[str, Any]) -> Any:
    """`extensions`, with thinking turned off for OpenAI's `reasoning.effort: "none"` (unless set there)."""
    extensions = body.get("extensions")
    reasoning = body.get("reasoning")
    if not (isinstance(reasoning, dict) and reasoning.get("effort") == "none"):
        return extensions
    if extensions is not None and not isinstance(extensions, dict):
        return extensions  # the LMSP parser names the fault
    own = (extensions or {}).get("lmsp_tray")
    if own is not None and not isinstance(own, dict):
        return extensions
    return {**(extensions or {}), "lmsp_tray": {"reasoning": False, **(own or {})}}


def parse_openai_response_create(body: Any) -> tuple[ResponseRequest, ToolMap]:
    """Validate an OpenAI Responses body into the service's `ResponseRequest`, and the map of its tools.

    The request keeps the body as sent in `raw` (idempotency) and carries the OpenAI fields a
    response object echoes (`response_fields`); its `input_items` (what a stored turn keeps) are
    the rewritten items, so a conversation continued later reads them back as the model saw them.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if body.get("background"):
        raise UnsupportedCapability(
            "Background responses are not supported here; stream the response instead.", param="background"
        )
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            raise UnsupportedCapability(f"'{name}' is not supported by this service.", param=name)
    tools = tool_map(body.get("tools"))
    offered = _function_tools(body.get("tools"))
    choice, offered = _tool_choice(body.get("tool_choice"), offered, tools)
    store = body.get("store")
    lmsp = {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "input", "store")}
    lmsp["store"] = True if store is None else store
    lmsp["input"] = _input(body.get("input"), tools)
    if offered:
        lmsp["tools"] = offered
    if choice is not None:
        lmsp["tool_choice"] = choice
    lmsp["extensions"] = _reasoning_off(body)
    request = parse_response_create(lmsp)
    echoed = {k: body.get(k, default) for k, default in ECHOED_DEFAULTS.items()}
    echoed["metadata"] = echoed["metadata"] or {}
    echoed["tools"] = echoed["tools"] or []
    echoed["tool_choice"] = echoed["tool_choice"] or "auto"
    echoed["store"] = request.store
    echoed["text"] = body.get("text") or {"format": {"type": "text"}}
    if tools.left_out:
        echoed["extensions"] = {"lmsp_tray": {"tools_left_out": [dict(t) for t in tools.left_out]}}
    return dataclasses.replace(request, raw=body, response_fields=echoed), tools
