"""Where a rendered prompt's stable prefix ends: the part the next conversation will share.

Why: a new conversation with the same app shares with the last one its system prompt
and its tools (Claude Code's next session: ~18k tokens of its ~20k), and nothing after.
A sliding-window model can go back only to where it checkpointed its window, so the
engine needs that point named (`GenerationJob.stable_prefix`) to checkpoint there and
save it with the prompt cache. Anthropic's requests mark it with `cache_control` on
their system blocks and tools; other APIs do not mark it at all. Every chat template
renders system and tools first, so the same rule serves every API: render the system
messages and tools followed by two different user messages; the text they share, as far
as the real prompt shares it too, is the stable prefix. A template that places tools
after the messages, or rejects the probe, has none (0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from lmsp_tray.errors import InvalidRequest

PROBES = ("\x01", "\x02")  # two user messages that part at their first character
MIN_CHARS = 1024  # a shorter prefix is cheap to evaluate again (a few hundred tokens at most)


class Template(Protocol):
    def render(  # pragma: no cover
        self, messages: Sequence[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = True, **extra: Any
    ) -> str: ...


def stable_chars(template: Template, messages: Sequence[dict[str, Any]], tools: Any, prompt: str, **extra: Any) -> int:
    """How many of `prompt`'s first characters (the rendering of `messages` with `tools`) are its system
    messages and tools, as any conversation starting with them renders them; 0 when under `MIN_CHARS`."""
    head = []
    for message in messages:
        if message.get("role") not in ("system", "developer"):
            break
        head.append(message)
    if not head and not tools:
        return 0
    try:
        a, b = (
            template.render([*head, {"role": "user", "content": p}], tools=tools, add_generation_prompt=False, **extra)
            for p in PROBES
        )
    except InvalidRequest:
        return 0
    n = _shared(a[: _shared(a, b)], prompt)
    return n if n >= MIN_CHARS else 0


def _shared(a: str, b: str) -> int:
    """How many characters `a` and `b` share from the start."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
