"""Model names a person maps to a local model (`[model_aliases]` in config.toml), on every API.

Why: some apps ask for a model by a name they were built with and cannot be
told another — Claude Code asks for `claude-…` names, some Ollama apps insist
on `llama3.2`. A person points such a name at a local model with one line:

    [model_aliases]
    "claude-sonnet-4-5" = "gemma-3:270m-q4_k_m"

`resolve_model` is the one rule every API (`/lmsp/v1`, `/v1`, the Ollama and
Anthropic routes) goes through, via `Service.entry`: the service's own ids
first (an alias never hides a model), then the person's aliases; a name that
is neither is not found — never silently answered by another model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

E = TypeVar("E")


def resolve_model(resolve: Callable[[str], E | None], aliases: Mapping[str, str], name: str) -> E | None:
    """The model `name` means: `resolve(name)` (the catalog's own ids), else the model its alias names
    (matched exactly, then ignoring case), else None."""
    entry = resolve(name)
    if entry is not None:
        return entry
    target = aliases.get(name)
    if target is None:
        folded = name.strip().lower()
        target = next((t for alias, t in aliases.items() if alias.strip().lower() == folded), None)
    return None if target is None else resolve(target)
