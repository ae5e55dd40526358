"""Tokenizing a prompt piece by piece, so a continued conversation does not re-tokenize its history.

A conversation sent again every turn renders to a prompt that repeats all earlier
turns. Tokenizing it whole costs about 10 µs per token in llama.cpp with a large
vocabulary (Gemma 3's 262k tokens: ~50 ms for a 4,500-token history, paid again on
every turn before the first new token can be evaluated). llama.cpp first splits the
text at special tokens and then tokenizes the text between them independently, so a
prompt cut just before each turn marker (`<start_of_turn>`, `<|im_start|>`, ...)
tokenizes to the concatenation of its pieces' tokens. That holds for a marker when
no special token at least as long can overlap it (llama.cpp matches longer special
tokens first) and the marker does not strip whitespace on its left. `turn_markers`
picks the markers of a template for which it holds; `PromptTokenizer` cuts there,
takes the pieces it has seen from a bounded cache and tokenizes only the new ones.
"""

from __future__ import annotations

import array
import collections
import itertools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SpecialToken:
    """A token llama.cpp splits out of text before tokenizing (control, user-defined or unknown)."""

    text: str
    control: bool = True
    lstrip: bool = False  # llama.cpp strips whitespace to its left when it splits it out


def can_overlap(marker: str, other: str) -> bool:
    """True when `other`, matched somewhere in a text, could cover part (or all) of an occurrence of `marker`."""
    for k in range(1 - len(other), len(marker)):  # `other` placed at offset k from the marker's start
        lo, hi = max(0, k), min(len(marker), k + len(other))
        if marker[lo:hi] == other[lo - k : hi - k] and not (k == 0 and other == marker):
            return True
    return False


def turn_markers(specials: Sequence[SpecialToken], template_source: str) -> list[str]:
    """Control tokens the chat template writes literally, before which a prompt can be cut safely."""
    texts = [s.text for s in specials if s.text]
    markers = []
    for s in specials:
        if not (s.control and s.text and not s.lstrip and s.text in template_source):
            continue
        rivals = (t for t in texts if len(t) >= len(s.text) and t != s.text)  # matched before it
        if not any(can_overlap(s.text, t) for t in rivals):
            markers.append(s.text)
    return sorted(set(markers), key=lambda m: (-len(m), m))


class PromptTokenizer:
    """Tokenizes prompts as cached pieces cut before turn markers; thread-safe.

    `tokenize(piece)` must tokenize text without the model's start tokens (BOS), parsing
    special tokens; `start` are the tokens the model puts before every prompt.
    """

    def __init__(
        self,
        tokenize: Callable[[str], list[int]],
        markers: Sequence[str],
        *,
        start: Sequence[int] = (),
        max_cached_tokens: int = 1 << 18,
    ) -> None:
        self._tokenize = tokenize
        self._start = list(start)
        self._cut = re.compile("|".join(map(re.escape, markers))) if markers else None
        self._cache: collections.OrderedDict[str, array.array] = collections.OrderedDict()
        self._cached_tokens = 0
        self._max_cached = max_cached_tokens
        self._lock = threading.Lock()
        self.hits = 0  # pieces taken from the cache (observable by tests)
        self.misses = 0

    @property
    def markers(self) -> bool:
        return self._cut is not None

    def pieces(self, text: str) -> list[str]:
        """`text` cut before every marker occurrence (the pieces join back to `text`)."""
        if self._cut is None:
            return [text] if text else []
        cuts = [m.start() for m in self._cut.finditer(text) if m.start() > 0]
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    def tokens(self, text: str) -> list[int]:
        out = list(self._start)
        for piece in self.pieces(text):
            out.extend(self._piece(piece))
        return out

    def _piece(self, piece: str) -> array.array:
        with self._lock:
            found = self._cache.get(piece)
            if found is not None:
                self._cache.move_to_end(piece)
                self.hits += 1
                return found
        tokens = array.array("i", self._tokenize(piece))  # outside the lock: the slow part
        with self._lock:
            self.misses += 1
            if len(tokens) <= self._max_cached and piece not in self._cache:
                self._cache[piece] = tokens
                self._cached_tokens += len(tokens)
                while self._cached_tokens > self._max_cached:
                    _, dropped = self._cache.popitem(last=False)
                    self._cached_tokens -= len(dropped)
        return tokens
