"""A JSON Schema `pattern` (the common subset of ECMA-262 regular expressions) as a GBNF rule for a JSON string.

Why: pydantic's constrained strings (`constr(pattern=...)`, `Field(pattern=...)`)
send `pattern` in every schema they generate, so `chat.completions.parse`
with such a model failed with 400. The grammar generates only strings the
whole pattern matches, written as JSON string content (a `"` in the text is
written `\\"`, a tab `\\t`); a JSON Schema pattern is not anchored, so any of
those strings is valid — the grammar yields a subset of what the schema
allows, never more.

Supported: literals and escapes (`\\.`, `\\n`, `\\t`, `\\uXXXX`, `\\xXX`), `.`,
classes (`[a-z_]`, `[^,]`, `\\d \\w \\s \\D \\W \\S`), groups (`(…)`,
`(?:…)`, `(?<name>…)`), alternation, quantifiers (`* + ? {n} {n,} {n,m}`, lazy
forms alike) and `^` / `$` at the ends. Refused (`RegexError`): back
references, lookaround, `\\b`, anchors elsewhere, and patterns nested or
repeated beyond a small size.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmsp_tray.chat.gbnf import literal

MAX_PATTERN = 2000  # characters of pattern compiled
MAX_REPEAT = 1000  # the largest {n,m} bound


class RegexError(ValueError):
    """A pattern this module cannot turn into a grammar (the message says why)."""


# -- the syntax tree ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chars:
    """One character out of a set: `ranges` (inclusive code point pairs), or any but them when `negated`."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Seq:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    node: Node
    lo: int
    hi: int | None


Node = Chars | Seq | Alt | Repeat

_DIGIT = ((48, 57),)
_WORD = ((48, 57), (65, 90), (95, 95), (97, 122))
_SPACE = ((9, 13), (32, 32), (0xA0, 0xA0), (0x2028, 0x2029), (0xFEFF, 0xFEFF))
_CLASSES = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True)}
_CLASSES.update({"s": (_SPACE, False), "S": (_SPACE, True)})
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0}
_LINE_ENDS = ((10, 10), (13, 13), (0x2028, 0x2029))


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def error(self, what: str) -> RegexError:
        return RegexError(f"{what} (at character {self.i + 1} of the pattern) cannot be enforced")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self) -> str:
        ch = self.p[self.i]
        self.i += 1
        return ch

    def parse(self) -> Node:
        node = self.alternation()
        if self.i != len(self.p):
            raise self.error(f"'{self.p[self.i]}'")
        return node

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        parts: list[Node] = []
        while (ch := self.peek()) is not None and ch not in "|)":
            parts.append(self.quantified())
        return parts[0] if len(parts) == 1 else Seq(tuple(parts))

    def quantified(self) -> Node:
        atom = self.atom()
        while (ch := self.peek()) is not None and ch in "*+?{":
            if ch == "{":
                bounds = self.braces()
                if bounds is None:
                    break  # a literal '{'
                lo, hi = bounds
            else:
                self.take()
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
            if self.peek() == "?":  # lazy: the same strings
                self.take()
            atom = Repeat(atom, lo, hi)
        return atom

    def braces(self) -> tuple[int, int | None] | None:
        end = self.p.find("}", self.i)
        body = self.p[self.i + 1 : end] if end > 0 else ""
        lo_text, comma, hi_text = body.partition(",")
        if not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
            return None
        lo, hi = int(lo_text), (int(hi_text) if hi_text else None) if comma else int(lo_text)
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"a repetition over {MAX_REPEAT}")
        if hi is not None and hi < lo:
            raise self.error(f"'{{{body}}}' (its bounds are reversed) ")
        self.i = end + 1
        return lo, hi

    def atom(self) -> Node:
        ch = self.take()
        if ch == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?<", self.i) and not self.p.startswith(("?<=", "?<!"), self.i):
                end = self.p.find(">", self.i)
                if end < 0:
                    raise self.error("an unclosed group name")
                self.i = end + 1
            elif self.peek() == "?":
                raise self.error("lookaround")
            node = self.alternation()
            if self.peek() != ")":
                raise self.error("an unclosed group")
            self.take()
            return node
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return Chars(_LINE_ENDS, negated=True)
        if ch == "\\":
            return self.escape(in_class=False)
        if ch in "^$":
            raise self.error(f"'{ch}' inside the pattern")
        if ch in "*+?":
            raise self.error(f"'{ch}' with nothing to repeat")
        if ch == ")":
            raise self.error("an unopened ')'")
        return Chars(((ord(ch), ord(ch)),))

    def escape(self, *, in_class: bool) -> Chars:
        if self.peek() is None:
            raise self.error("a trailing backslash")
        ch = self.take()
        if ch in _CLASSES:
            ranges, negated = _CLASSES[ch]
            return Chars(ranges, negated)
        if ch in _SIMPLE_ESCAPES:
            code = _SIMPLE_ESCAPES[ch]
        elif ch in "ux":
            width = 4 if ch == "u" else 2
            digits = self.p[self.i : self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"'\\{ch}{digits}'")
            self.i += width
            code = int(digits, 16)
        elif ch.isdigit() or ch == "k":
            raise self.error("a back reference")
        elif ch in "bB" and not in_class:
            raise self.error("a word boundary")
        elif ch == "b":
            code = 8
        elif ch.isalnum():
            raise self.error(f"'\\{ch}'")
        else:
            code = ord(ch)
        return Chars(((code, code),))

    def char_class(self) -> Chars:
        negated = self.peek() == "^"
        if negated:
            self.take()
        ranges: list[tuple[int, int]] = []
        inverse: list[tuple[int, int]] = []  # \D \W \S inside a class
        first = True
        while True:
            ch = self.peek()
            if ch is None:
                raise self.error("an unclosed '['")
            if ch == "]" and not first:
                self.take()
                break
            first = False
            item = self.class_atom()
            if item.negated:
                if negated:
                    raise self.error("a negated shorthand inside a negated class")
                inverse.extend(item.ranges)
                continue
            lo, hi = item.ranges[0]
            if (
                len(item.ranges) == 1
                and lo == hi
                and self.peek() == "-"
                and self.p[self.i + 1 : self.i + 2] not in ("]", "")
            ):
                self.take()
                end = self.class_atom()
                if end.negated or len(end.ranges) != 1 or end.ranges[0][0] != end.ranges[0][1]:
                    raise self.error("a range ending in a class")
                if end.ranges[0][0] < lo:
                    raise self.error("a reversed range")
                ranges.append((lo, end.ranges[0][0]))
            else:
                ranges.extend(item.ranges)
        if inverse:
            if ranges:
                raise self.error("a class mixing \\D, \\W or \\S with other characters")
            return Chars(tuple(inverse), negated=True)
        return Chars(tuple(ranges), negated)

    def class_atom(self) -> Chars:
        ch = self.take()
        if ch == "\\":
            return self.escape(in_class=True)
        if ch == "[" and self.peek() == ":":
            raise self.error("a POSIX class")
        return Chars(((ord(ch), ord(ch)),))


def parse(pattern: str) -> Node:
    """The syntax tree of a pattern, anchors at its ends dropped (a JSON Schema pattern is a search)."""
    if len(pattern) > MAX_PATTERN:
        raise RegexError(f"a pattern over {MAX_PATTERN} characters cannot be enforced")
    body = pattern.removeprefix("^")
    if body.endswith("$"):
        slashes = len(body[:-1]) - len(body[:-1].rstrip("\\"))
        if slashes % 2 == 0:  # not an escaped '$'
            body = body[:-1]
    return _Parser(body).parse()


def length_bounds(node: Node) -> tuple[int, int | None]:
    """The fewest and most characters a match has (None: no limit)."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Seq):
        lo = 0
        hi_or_none: int | None = 0
        for part in node.parts:
            a, b = length_bounds(part)
            lo += a
            hi_or_none = None if hi_or_none is None or b is None else hi_or_none + b
        return lo, hi_or_none
    if isinstance(node, Alt):
        bounds = [length_bounds(o) for o in node.options]
        highs = [b for _, b in bounds]
        return min(a for a, _ in bounds), None if None in highs else max(b for b in highs if b is not None)
    a, b = length_bounds(node.node)
    return a * node.lo, None if node.hi is None or b is None else b * node.hi


# -- GBNF ------------------------------------------------------------------------------------------------

# Characters a JSON string holds only as escapes: the escape the grammar writes for each.
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_RAW_FORBIDDEN = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F), (0xD800, 0xDFFF))


def _class_char(code: int) -> str:
    if 0x30 <= code <= 0x39 or 0x41 <= code <= 0x5A or 0x61 <= code <= 0x7A:
        return chr(code)
    return f"\\x{code:02X}" if code < 0x100 else (f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}")


def _minus(ranges: list[tuple[int, int]], cut: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for c_lo, c_hi in cut:
            nxt = []
            for a, b in pieces:
                if c_hi < a or c_lo > b:
                    nxt.append((a, b))
                    continue
                if a < c_lo:
                    nxt.append((a, c_lo - 1))
                if b > c_hi:
                    nxt.append((c_hi + 1, b))
            pieces = nxt
        out.extend(pieces)
    return out


def _chars(node: Chars) -> str:
    """One character of a JSON string's content as a GBNF expression."""
    if node.negated:
        excluded = "".join(
            _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"
            for lo, hi in (*node.ranges, *_RAW_FORBIDDEN)
        )
        return f"[^{excluded}\\U00110000-\\U7FFFFFFF]"
    raw = _minus(list(node.ranges), _RAW_FORBIDDEN)
    alts = []
    if raw:
        alts.append(
            "[" + "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in raw) + "]"
        )
    for code, escaped in _JSON_ESCAPES.items():
        if any(lo <= code <= hi for lo, hi in node.ranges):
            alts.append(literal(escaped))
    if not alts:
        raise RegexError("a class of only control characters cannot be written in a JSON string")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _single(node: Node) -> str | None:
    """The JSON text of a node that matches exactly one character (None for anything else)."""
    if not isinstance(node, Chars) or node.negated or len(node.ranges) != 1 or node.ranges[0][0] != node.ranges[0][1]:
        return None
    code = node.ranges[0][0]
    if code in _JSON_ESCAPES:
        return _JSON_ESCAPES[code]
    if any(lo <= code <= hi for lo, hi in _RAW_FORBIDDEN):
        return f"\\u{code:04x}"
    return chr(code)


def to_gbnf(node: Node) -> str:
    """A GBNF expression for the JSON string content of the strings `node` matches whole."""
    single = _single(node)
    if single is not None:
        return literal(single)
    if isinstance(node, Chars):
        return _chars(node)
    if isinstance(node, Seq):
        parts: list[str] = []
        run = ""
        for part in node.parts:
            text = _single(part)
            if text is not None:
                run += text
                continue
            if run:
                parts.append(literal(run))
                run = ""
            parts.append(to_gbnf(part))
        if run:
            parts.append(literal(run))
        return "(" + " ".join(parts) + ")" if parts else '""'
    if isinstance(node, Alt):
        return "(" + " | ".join(to_gbnf(o) for o in node.options) + ")"
    inner = to_gbnf(node.node)
    if (node.lo, node.hi) == (0, None):
        return f"{inner}*"
    if (node.lo, node.hi) == (1, None):
        return f"{inner}+"
    if (node.lo, node.hi) == (0, 1):
        return f"{inner}?"
    return (
        f"{inner}{{{node.lo},{'' if node.hi is None else node.hi}}}" if node.hi != node.lo else f"{inner}{{{node.lo}}}"
    )
