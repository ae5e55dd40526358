"""Token pieces to text deltas: always whole UTF-8 characters, stop strings cut exactly.

A token may end in the middle of a multi-byte character, and a stop string
may span several tokens. `TextStream` holds back exactly what is needed (an
incomplete character, or text that could still become a stop string) and
releases the rest at once, so the concatenation of the deltas is the final
text and nothing after a stop string ever leaves. Invalid byte sequences
become U+FFFD, as every UTF-8 decoder does.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._max_hold = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Feed one token's bytes; return the text that may be released now (maybe '')."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(piece)
        if not self._stops:
            self._held = ""
            return text
        cut = -1
        for stop in self._stops:
            at = text.find(stop)
            if at != -1 and (cut == -1 or at < cut):
                cut = at
        if cut != -1:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_stop_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """End of generation: release what was held (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        upto = min(len(text), self._max_hold - 1)
        for n in range(upto, 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0
