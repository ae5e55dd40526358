"""Token pieces to text deltas: always whole UTF-8 characters, stop strings cut exactly.

A token may end in the middle of a multi-byte character, and a stop string
may span several tokens. `TextStream` holds back exactly what is needed (an
incomplete character, or text that could still become a stop string) and
releases the rest at once, so the concatenation of the deltas is the final
text and nothing after a stop string ever leaves. Invalid byte sequences
become U+FFFD, as every UTF-8 decoder does.

Under a grammar the text must be what the grammar checked, and llama.cpp's
grammar decodes UTF-8 leniently (an overlong `C1 A3` is 'c' to it). With
`grammar_utf8=True` the stream decodes exactly as llama.cpp's grammar does
(`GrammarUTF8Decoder`), so a schema-valid JSON stays schema-valid as text.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class GrammarUTF8Decoder:
    """UTF-8 decoded the way llama.cpp's grammar engine decodes a token's bytes.

    A sequence's length comes from its first byte's high nibble; within one
    token, continuation bytes are not checked and overlong forms are taken at
    their value; a continuation carried over from an earlier token must look
    like one. Code points Unicode text cannot hold (surrogates, above
    U+10FFFF) become U+FFFD, as do bytes that cannot start a sequence.
    """

    _LENGTH = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)

    def __init__(self) -> None:
        self._value = 0
        self._remain = 0

    @staticmethod
    def _char(value: int) -> str:
        return "\ufffd" if 0xD800 <= value <= 0xDFFF or value > 0x10FFFF else chr(value)

    def decode(self, data: bytes, final: bool = False) -> str:
        out: list[str] = []
        pos = 0
        while pos < len(data) and self._remain > 0:  # finish the sequence an earlier token began
            byte = data[pos]
            if byte >> 6 != 2:
                out.append("\ufffd")
                self._remain = 0
                break
            self._value = (self._value << 6) | (byte & 0x3F)
            self._remain -= 1
            pos += 1
            if self._remain == 0:
                out.append(self._char(self._value))
        while pos < len(data):
            first = data[pos]
            pos += 1
            length = self._LENGTH[first >> 4]
            if length == 0:
                out.append("\ufffd")
                continue
            remain = length - 1
            value = first & ((1 << (7 - remain)) - 1)
            while pos < len(data) and remain > 0:
                value = (value << 6) | (data[pos] & 0x3F)
                pos += 1
                remain -= 1
            if remain == 0:
                out.append(self._char(value))
            else:
                self._value, self._remain = value, remain
        if final and self._remain > 0:
            out.append("\ufffd")
            self._remain = 0
        return "".join(out)


class TextStream:
    def __init__(self, stop: Sequence[str] = (), *, grammar_utf8: bool = False) -> None:
        self._decoder: GrammarUTF8Decoder | codecs.IncrementalDecoder = (
            GrammarUTF8Decoder() if grammar_utf8 else codecs.getincrementaldecoder("utf-8")(errors="replace")
        )
        self._stops = tuple(s for s in stop if s)
        self._max_hold = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the text

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
                self.stopped_by = stop
        if cut != -1:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_stop_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
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
