"""Identifiers: a prefix plus a ULID, as LMSP requires (`resp_…`, `msg_…`, …)."""

from __future__ import annotations

from ulid import ULID

PREFIXES = frozenset({"resp", "msg", "fc", "call", "rs", "task", "tok", "pair"})


def new_id(prefix: str) -> str:
    """A fresh, time-ordered identifier such as ``resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF``."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    return f"{prefix}_{ULID()}"
