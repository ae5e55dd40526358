"""GBNF building blocks: a rule set, literals, JSON primitives, number ranges, string formats.

llama.cpp constrains decoding with GBNF grammars. `Grammar` collects named
rules (deduplicated, names made unique) and renders the text llama.cpp parses.
The helpers here produce rules that are *sound*: every string they accept is
valid JSON and satisfies the constraint they stand for (integer and number
ranges, date/time/uuid/email/uri/ipv4/hostname strings, text that never
contains a marker such as `</think>`). Where a constraint cannot be expressed
exactly they accept a subset, never a superset.
"""

from __future__ import annotations

import re

_NAME_RE = re.compile(r"[^a-zA-Z0-9-]+")
_LITERALS_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')
_WORD_RE = re.compile(r"[a-zA-Z0-9-]+")

# JSON whitespace between tokens: at most one space, so a model cannot run away in blanks.
SPACE = '" "?'

PRIMITIVES: dict[str, str] = {
    "space": SPACE,
    # One JSON string character: anything but quote, backslash and control characters, or an
    # escape. \u escapes of UTF-16 surrogates are left out so one `char` is one code point.
    # Surrogates and code points beyond U+10FFFF are out too (llama.cpp decodes bytes leniently).
    "char": r'[^"\\\x7F\x00-\x1F\uD800-\uDFFF\U00110000-\U7FFFFFFF] | "\\" (["\\/bfnrt] | "u" '
    r"([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))",
    "string": r'"\"" char* "\"" space',
    "integral-part": '"0" | [1-9] [0-9]{0,15}',
    "decimal-part": "[0-9]{1,16}",
    "number": '"-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)? space',
    "integer": '"-"? integral-part space',
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space (string ":" space value ("," space string ":" space value)*)? "}" space',
    "array": '"[" space (value ("," space value)*)? "]" space',
}
_PRIMITIVE_DEPS: dict[str, tuple[str, ...]] = {
    "char": (),
    "string": ("char", "space"),
    "integral-part": (),
    "decimal-part": (),
    "number": ("integral-part", "decimal-part", "space"),
    "integer": ("integral-part", "space"),
    "boolean": ("space",),
    "null": ("space",),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("string", "value", "space"),
    "array": ("value", "space"),
    "space": (),
}


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def class_char(ch: str) -> str:
    """One character escaped for use inside a GBNF character class."""
    if ch.isalnum() and ord(ch) < 128:
        return ch
    code = ord(ch)
    return f"\\x{code:02X}" if code < 0x100 else (f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}")


class Grammar:
    """A set of GBNF rules under unique names; `text()` is what llama.cpp parses."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        """Add a rule (or find an identical one) and return the name it lives under."""
        base = _NAME_RE.sub("-", name).strip("-") or "r"
        key, i = base, 0
        while key in self.rules and self.rules[key] != body:
            i += 1
            key = f"{base}-{i}"
        self.rules[key] = body
        return key

    def reserve(self, name: str) -> str:
        """Claim a unique name now (for recursive rules) and fill it in later with `define`."""
        base = _NAME_RE.sub("-", name).strip("-") or "r"
        key, i = base, 0
        while key in self.rules:
            i += 1
            key = f"{base}-{i}"
        self.rules[key] = ""
        return key

    def define(self, key: str, body: str) -> None:
        self.rules[key] = body

    def primitive(self, name: str) -> str:
        """Add a JSON primitive rule (and what it uses) under its canonical name."""
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for dep in _PRIMITIVE_DEPS[name]:
                self.primitive(dep)
        return name

    def references(self, body: str) -> list[str]:
        """Rule names used in a rule body (outside literals and character classes)."""
        bare = _LITERALS_RE.sub(" ", body)
        return [w for w in _WORD_RE.findall(bare) if w in self.rules]

    def text(self, *roots: str) -> str:
        """The grammar text; with `roots`, only the rules reachable from them."""
        keep = set(self.rules)
        if roots:
            keep, todo = set(), list(roots)
            while todo:
                name = todo.pop()
                if name not in keep:
                    keep.add(name)
                    todo.extend(self.references(self.rules[name]))
        return "\n".join(f"{name} ::= {body}" for name, body in self.rules.items() if name in keep)


def literal_trie(texts: list[str]) -> str:
    """A GBNF expression matching exactly one of `texts` (non-empty strings), as a prefix tree.

    A flat alternation of N literals makes llama.cpp's grammar carry N parse stacks at once and
    compare them pairwise on every token (quadratic: a 12,000-value enum took seconds per token).
    Sharing prefixes keeps the stacks to the branches at the current point: `"a" ("pple" | "rt")`
    instead of `"apple" | "art"`. Built without recursion (values may be long)."""
    root: dict = {}
    for text in dict.fromkeys(texts):
        if not text:
            raise ValueError("literal_trie needs non-empty texts")
        node = root
        for ch in text:
            node = node.setdefault(ch, {})
        node[None] = True  # a text ends here

    def edges(node: dict) -> list[tuple[str, dict]]:
        """(label, node below it) for each way on, single-child chains merged into one label."""
        out = []
        for ch in sorted(k for k in node if k is not None):
            label, below = [ch], node[ch]
            while None not in below and len(below) == 1:
                ((nxt, below),) = below.items()
                label.append(nxt)
            out.append(("".join(label), below))
        return out

    groups: dict[int, str] = {}
    stack: list[tuple[dict, list[tuple[str, dict]] | None]] = [(root, None)]
    while stack:
        node, ways = stack.pop()
        if ways is None:  # first visit: its branches first
            ways = edges(node)
            stack.append((node, ways))
            stack.extend((below, None) for _, below in ways if len(below) > (1 if None in below else 0))
            continue
        alts = [literal(label) + (f" {groups[id(below)]}" if id(below) in groups else "") for label, below in ways]
        body = " | ".join(alts)
        if None in node:
            groups[id(node)] = f"({body})?"
        else:
            groups[id(node)] = body if len(alts) == 1 else f"({body})"
    return groups[id(root)]


# ---------------------------------------------------------------------------------------------
# Integer and number ranges


def _digits_range(lo: str, hi: str) -> list[str]:
    """GBNF alternatives for the decimal strings from `lo` to `hi` (same length, lo <= hi)."""
    if lo == hi:
        return [literal(lo)]
    if len(lo) == 1:
        return [f"[{lo}-{hi}]"]
    i = 0
    while lo[i] == hi[i]:
        i += 1
    if i:
        return [f"{literal(lo[:i])} ({' | '.join(_digits_range(lo[i:], hi[i:]))})"]
    rest = len(lo) - 1
    first, last = int(lo[0]), int(hi[0])
    alts: list[str] = []
    mid_from, mid_to = first + 1, last - 1
    if lo[1:] == "0" * rest:
        mid_from = first
    else:
        alts.append(f"{literal(lo[0])} ({' | '.join(_digits_range(lo[1:], '9' * rest))})")
    hi_full = hi[1:] == "9" * rest
    if hi_full:
        mid_to = last
    if mid_from <= mid_to:
        digit = literal(str(mid_from)) if mid_from == mid_to else f"[{mid_from}-{mid_to}]"
        alts.append(f"{digit} [0-9]{{{rest}}}")
    if not hi_full:
        alts.append(f"{literal(hi[0])} ({' | '.join(_digits_range('0' * rest, hi[1:]))})")
    return alts


MAX_DIGITS = 16  # longest integer part a range rule produces when unbounded above


def natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives matching the canonical decimal form of every integer in [lo, hi] (lo >= 0).

    `hi=None` is unbounded (up to MAX_DIGITS digits)."""
    assert lo >= 0 and (hi is None or hi >= lo)
    alts: list[str] = []
    longest = max(len(str(lo)), MAX_DIGITS)
    top = len(str(hi)) if hi is not None else longest
    for width in range(len(str(lo)), top + 1):
        start = max(lo, 10 ** (width - 1) if width > 1 else 0)
        end = 10**width - 1 if hi is None else min(hi, 10**width - 1)
        if start > end:
            continue
        if hi is None and start == 10 ** (width - 1) and width > 1:
            alts.append(f"[1-9] [0-9]{{{width - 1},{longest - 1}}}")
            break
        alts.extend(_digits_range(str(start), str(end)))
    return alts


def integer_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the integers in [lo, hi] (either bound may be None), no `space`."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError("empty integer range")
    alts: list[str] = []
    if hi is None or hi >= 0:  # the non-negative part
        alts.extend(natural_range(max(lo or 0, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # the negative part: "-" then magnitudes in [max(1,-hi), -lo]
        mag_lo = max(1, -hi) if hi is not None else 1
        mag_hi = -lo if lo is not None else None
        if mag_hi is None or mag_hi >= mag_lo:
            alts.append(f'"-" ({" | ".join(natural_range(mag_lo, mag_hi))})')
    if not alts:
        raise ValueError("empty integer range")
    return "(" + " | ".join(alts) + ")"


_ANY_FRACTION = '("." [0-9]{1,15})?'
_ZERO_FRACTION = '("." "0"{1,15})?'
_NONZERO_FRACTION = '"." [0-9]{0,14} [1-9]'


def _nonnegative_part(lo: int | None, hi: int | None, lo_ex: bool, hi_ex: bool) -> list[str]:
    """Texts `N` / `N.F` (value in [N, N+1)) whose every value y >= 0 satisfies the bounds."""
    if lo is None or lo < 0:
        lo, lo_ex = 0, False
    if hi is not None and (hi < lo or (hi == lo and (lo_ex or hi_ex))):
        return []
    alts: list[str] = []
    low = lo
    if lo_ex:
        if hi is None or hi >= lo + 1:
            alts.append(f"{literal(str(lo))} {_NONZERO_FRACTION}")
        low = lo + 1
    top = None if hi is None else hi - 1
    if top is None or top >= low:
        alts.append(f"({' | '.join(natural_range(low, top))}) {_ANY_FRACTION}")
    if hi is not None and hi >= low and not hi_ex:
        alts.append(f"{literal(str(hi))} {_ZERO_FRACTION}")
    return alts


def number_range(lo: int | None, hi: int | None, *, lo_exclusive: bool = False, hi_exclusive: bool = False) -> str:
    """A GBNF expression for decimal numbers x with lo <(=) x <(=) hi; the bounds are integers.

    No exponents. Text `N.F` lies in [N, N+1) and `-N.F` in (-(N+1), -N], so each
    alternative picks integer parts whose whole interval fits the bounds."""
    alts: list[str] = []
    if hi is None or hi > 0 or (hi == 0 and not hi_exclusive):
        alts.extend(_nonnegative_part(lo, hi, lo_exclusive, hi_exclusive))
    if lo is None or lo < 0:  # x = -y: y's bounds are the mirror image
        neg = _nonnegative_part(None if hi is None else -hi, None if lo is None else -lo, hi_exclusive, lo_exclusive)
        if neg:
            alts.append('"-" (' + " | ".join(neg) + ")")
    if not alts:
        raise ValueError("empty number range")
    return "(" + " | ".join(alts) + ")"


# ---------------------------------------------------------------------------------------------
# String formats (the text between the quotes). Each accepts only strings the format allows.

_LABEL = "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,30} [a-zA-Z0-9])?"
_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])'

FORMATS: dict[str, dict[str, str]] = {
    "date": {
        "fmt-date": 'fmt-year "-" ("0" [13578] "-" fmt-day31 | "1" [02] "-" fmt-day31 | "0" [469] "-" fmt-day30 '
        '| "11" "-" fmt-day30 | "02" "-" fmt-day28)',
        "fmt-year": "[1-9] [0-9]{3}",
        "fmt-day28": '"0" [1-9] | "1" [0-9] | "2" [0-8]',
        "fmt-day30": 'fmt-day28 | "29" | "30"',
        "fmt-day31": 'fmt-day30 | "31"',
    },
    "time": {
        "fmt-time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
        '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
    },
    "date-time": {"fmt-date-time": 'fmt-date "T" fmt-time'},
    "uuid": {"fmt-uuid": '[0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}'},
    "email": {
        "fmt-email": '[a-zA-Z0-9] ([a-zA-Z0-9._+-]{0,40} [a-zA-Z0-9])? "@" fmt-host',
        "fmt-host": f'{_LABEL} ("." {_LABEL}){{1,4}}',
    },
    "hostname": {"fmt-hostname": f'{_LABEL} ("." {_LABEL}){{0,4}}'},
    "ipv4": {"fmt-ipv4": f'{_OCTET} "." {_OCTET} "." {_OCTET} "." {_OCTET}'},
    "uri": {
        "fmt-uri": '("https" | "http") "://" fmt-host-u (":" [1-9] [0-9]{0,3})? ("/" fmt-seg){0,8} ("?" fmt-seg)?',
        "fmt-host-u": f'{_LABEL} ("." {_LABEL}){{0,4}}',
        "fmt-seg": "[a-zA-Z0-9._~%!$&'()*+,;=:@-]{0,30}",
    },
}
FORMATS["date-time"].update(FORMATS["date"])
FORMATS["date-time"].update(FORMATS["time"])
FORMATS["uri-reference"] = FORMATS["uri"]
FORMATS["iri"] = FORMATS["uri"]


def format_rule(grammar: Grammar, fmt: str) -> str:
    """The rule for a string in format `fmt`, quotes and trailing space included."""
    rules = FORMATS[fmt]
    for name, body in rules.items():
        grammar.rules.setdefault(name, body)
    main = next(iter(rules)) if fmt not in ("uri-reference", "iri") else "fmt-uri"
    grammar.primitive("space")
    return grammar.add(f"{fmt}-string", rf'"\"" {main} "\"" space')


# ---------------------------------------------------------------------------------------------
# Free text that never contains a marker


def text_without(grammar: Grammar, marker: str, name: str) -> str:
    """A rule matching any text (possibly empty) that does not contain `marker`.

    One rule per matched-prefix length of the marker (a KMP automaton), so the text can
    never complete the marker, however its characters are split into tokens."""
    n = len(marker)
    alphabet = sorted(set(marker))

    def step(state: int, ch: str) -> int:
        text = marker[:state] + ch
        for k in range(min(len(text), n), 0, -1):
            if text.endswith(marker[:k]):
                return k
        return 0

    names = [grammar.reserve(f"{name}-{k}") for k in range(n)]
    others = "[^" + "".join(class_char(c) for c in alphabet) + "]"
    for state in range(n):
        alts = [f"{others} {names[0]}"]
        for ch in alphabet:
            nxt = step(state, ch)
            if nxt < n:
                alts.append(f"{literal(ch)} {names[nxt]}")
        alts.append('""')
        grammar.define(names[state], " | ".join(alts))
    return names[0]
