"""When a lazy call grammar switches on: watched token by token in the model's thread.

With `tool_choice: auto` the model writes freely until it opens a call; from
then on the call must follow the grammar. `CallMarkers` says which markers
open a call (and the grammar rule that takes over after each), and where
thinking blocks start and end; it is plain data, so it travels to a model
process with the job. `CallTrigger`, made per job by `CallMarkers.start()`,
sees each token's text and, when the text so far ends with a call-open
marker (blanks after it are fine) outside a thinking block, names the rule.
It never matches inside `<think>…</think>`, and it fires at most once (the
rule it names allows further calls). It is a plain string check per token,
no regular expressions over the whole output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_BLANKS = " \t\r\n"


@dataclass(frozen=True)
class CallMarkers:
    """A lazy grammar's trigger, as data: marker -> rule, and the thinking markers."""

    markers: tuple[tuple[str, str], ...]  # (call-open marker, grammar rule that starts right after it)
    think: tuple[str, str] | None = None
    start_in_think: bool = False

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(root for _, root in self.markers))

    def start(self) -> CallTrigger:
        return CallTrigger(dict(self.markers), self.think, self.start_in_think)

    def to_json(self) -> dict[str, Any]:
        return {"markers": [list(m) for m in self.markers], "think": self.think, "start_in_think": self.start_in_think}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallMarkers:
        think = data.get("think")
        return cls(
            tuple((str(m), str(r)) for m, r in data["markers"]),
            (str(think[0]), str(think[1])) if think else None,
            bool(data.get("start_in_think")),
        )


class CallTrigger:
    def __init__(self, roots: dict[str, str], think: tuple[str, str] | None = None, in_think: bool = False) -> None:
        self._roots = dict(roots)  # marker -> grammar rule that starts right after it
        self._think = think
        self._in_think = bool(think and in_think)
        longest = max([len(m) for m in self._roots] + [len(m) for m in (think or ())] + [1])
        self._keep = longest + 16
        self._tail = ""
        self.fired = False

    def __call__(self, piece: bytes) -> str | None:
        """Feed one token's bytes; returns the rule to activate now, or None."""
        if self.fired:
            return None
        self._tail += piece.decode("utf-8", errors="replace")
        if self._think:
            open_, close = self._think
            while True:
                marker = close if self._in_think else open_
                at = self._tail.find(marker)
                if at < 0:
                    break
                self._tail = self._tail[at + len(marker) :]
                self._in_think = not self._in_think
            if self._in_think:
                self._tail = self._tail[-self._keep :]
                return None
        text = self._tail.rstrip(_BLANKS)
        for marker, root in self._roots.items():
            if text.endswith(marker):
                self.fired = True
                return root
        self._tail = self._tail[-self._keep :]
        return None
