"""Model families: how tools, calls, results and thinking look in each family's text.

A family is recognised from the chat template's source (the markers it
mentions). `Dialect` says which call syntax the model emits (Hermes/Qwen
`<tool_call>{…}</tool_call>`, Llama 3 JSON with optional `<|python_tag|>`,
Mistral `[TOOL_CALLS][…]` or `[TOOL_CALLS]name[ARGS]{…}`), whether the
template renders tools and tool turns itself (`native`) or the service adds
its built-in tool-use instruction, and which thinking markers the model uses.
`conversation()` turns LMSP input items into the messages the template gets.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmsp_tray.protocol.requests import FunctionCall, FunctionCallOutput, Item, Message, Tool

THINK_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("[THINK]", "[/THINK]"),
    ("<seed:think>", "</seed:think>"),
    ("◁think▷", "◁/think▷"),
)
THINK_SWITCHES = ("enable_thinking", "thinking", "reasoning_content")


@dataclass(frozen=True)
class CallSyntax:
    """How one family writes function calls."""

    family: str  # "hermes" | "llama3" | "mistral" | "mistral-args"
    open: str  # the marker that starts call(s)
    close: str | None  # the marker that ends one call, or None (calls run to the end of the output)
    args_key: str  # the key holding the arguments object
    parallel: bool  # several calls in one turn
    bare_json: bool = False  # a call may also be a bare JSON object at the start (Llama 3)
    extra_markers: tuple[str, ...] = ()  # other control markers that must stay visible (`[ARGS]`)


HERMES = CallSyntax("hermes", "<tool_call>", "</tool_call>", "arguments", parallel=True)
LLAMA3 = CallSyntax("llama3", "<|python_tag|>", None, "parameters", parallel=False, bare_json=True)
MISTRAL = CallSyntax("mistral", "[TOOL_CALLS]", None, "arguments", parallel=True)
MISTRAL_ARGS = CallSyntax("mistral-args", "[TOOL_CALLS]", None, "arguments", parallel=True, extra_markers=("[ARGS]",))


@dataclass(frozen=True)
class Dialect:
    syntax: CallSyntax
    native: bool  # the template renders tools, assistant tool_calls and tool results itself
    think: tuple[str, str] | None  # thinking markers, when the model thinks
    thinking_switch: bool  # the template reads enable_thinking (or a similar flag)


def detect(template_source: str | None) -> Dialect:
    """The family of a chat template (None: a built-in template, no tool or thinking support)."""
    src = template_source or ""
    if "[TOOL_CALLS]" in src:
        syntax, native = (MISTRAL_ARGS if "[ARGS]" in src else MISTRAL), True
    elif "<|python_tag|>" in src:
        syntax, native = LLAMA3, True
    elif "<tool_call>" in src:
        syntax, native = HERMES, True
    elif "<|start_header_id|>" in src and "tools" in src:
        syntax, native = LLAMA3, True
    else:
        syntax, native = HERMES, "tools" in src and "tool_calls" in src
    return Dialect(syntax, native, think_markers(src), any(s in src for s in THINK_SWITCHES))


def think_markers(template_source: str | None) -> tuple[str, str] | None:
    src = template_source or ""
    for open_, close in THINK_MARKERS:
        if close in src:
            return open_, close
    return None


def tool_specs(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Tools in the shape Hugging Face chat templates expect."""
    specs = []
    for t in tools:
        fn: dict[str, Any] = {"name": t.name, "parameters": t.parameters}
        if t.description:
            fn["description"] = t.description
        specs.append({"type": "function", "function": fn})
    return specs


def instruction(tools: Sequence[Tool], choice: str | dict[str, str]) -> str:
    """The built-in tool-use instruction for templates that do not render tools (Hermes style)."""
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
        *(json.dumps(spec, ensure_ascii=False) for spec in tool_specs(tools)),
        "</tools>",
        "",
        (
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:"
        ),
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call>",
        "",
        "Function results come back within <tool_response></tool_response> XML tags.",
    ]
    if choice == "required":
        lines.append("You must call at least one function now.")
    elif isinstance(choice, dict):
        lines.append(f"You must call the function '{choice['name']}' now.")
    return "\n".join(lines)


def _mistral_id(call_id: str) -> str:
    """Mistral templates insist on 9 alphanumeric characters for tool call ids."""
    digest = hashlib.sha256(call_id.encode("utf-8")).digest()
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(alphabet[b % len(alphabet)] for b in digest[:9])


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def conversation(items: Sequence[Item], dialect: Dialect, *, extra_system: str | None = None) -> list[dict[str, Any]]:
    """LMSP items as chat-template messages: HF style for native templates, plain text otherwise."""
    names = {i.call_id: i.name for i in items if isinstance(i, FunctionCall)}
    ids = _mistral_id if dialect.syntax.family.startswith("mistral") else (lambda c: c)
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, Message):
            messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCall):
            if dialect.native:
                call = {
                    "id": ids(item.call_id),
                    "type": "function",
                    "function": {"name": item.name, "arguments": _arguments(item.arguments)},
                }
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                elif last and last["role"] == "assistant" and "tool_calls" not in last:
                    last["tool_calls"] = [call]
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                text = (
                    "<tool_call>\n"
                    + json.dumps({"name": item.name, "arguments": _arguments(item.arguments)}, ensure_ascii=False)
                    + "\n</tool_call>"
                )
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant":
                    last["content"] = (last["content"] + "\n" if last["content"] else "") + text
                else:
                    messages.append({"role": "assistant", "content": text})
        elif isinstance(item, FunctionCallOutput):
            if dialect.native:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": ids(item.call_id),
                        "name": names.get(item.call_id, ""),
                        "content": item.output,
                    }
                )
            else:
                text = "<tool_response>\n" + item.output + "\n</tool_response>"
                last = messages[-1] if messages else None
                if last and last["role"] == "user" and last.get("tool_results"):
                    last["content"] += "\n" + text
                else:
                    messages.append({"role": "user", "content": text, "tool_results": True})
    for m in messages:
        m.pop("tool_results", None)
    if extra_system:
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + extra_system}
        else:
            messages.insert(0, {"role": "system", "content": extra_system})
    return messages
