"""JSON Schema to GBNF: number ranges and marker-free text checked exhaustively, refusals by keyword.

The range and text rules only use literals, character classes, repetition
and alternation, so they translate one-to-one into Python regular
expressions; checking every integer / many decimals against the regex checks
the rule itself. Real llama.cpp decoding under these grammars is covered by
the HTTP tests (`test_structured_http.py`, `test_tools_http.py`).
"""

from __future__ import annotations

import itertools
import random
import re

import pytest

from lmsp_tray.chat.gbnf import Grammar, integer_range, number_range, text_without
from lmsp_tray.chat.schema import SchemaError, compile_schema


def as_regex(expr: str) -> re.Pattern[str]:
    expr = re.sub(r'"((?:[^"\\]|\\.)*)"', lambda m: re.escape(m.group(1)), expr)
    return re.compile(expr.replace(" ", ""))


BOUNDS = [None, -101, -100, -99, -10, -9, -1, 0, 1, 9, 10, 11, 99, 100, 123, 999, 1000]


def test_integer_ranges_are_exact() -> None:
    for lo, hi in itertools.product(BOUNDS, BOUNDS):
        if lo is not None and hi is not None and lo > hi:
            continue
        rx = as_regex(integer_range(lo, hi))
        for n in range(-1300, 1300):
            inside = (lo is None or n >= lo) and (hi is None or n <= hi)
            assert bool(rx.fullmatch(str(n))) == inside, (lo, hi, n)
        assert not rx.fullmatch("-0") and not rx.fullmatch("007")


def test_unbounded_integers_stay_short_and_canonical() -> None:
    rx = as_regex(integer_range(12345, None))
    assert rx.fullmatch("12345") and rx.fullmatch("9" * 16) and not rx.fullmatch("9" * 17)
    assert not rx.fullmatch("12344") and not rx.fullmatch("012345")


DECIMALS = [
    f"{sign}{i}{frac}"
    for sign in ("", "-")
    for i in range(14)
    for frac in ("", ".0", ".00", ".5", ".05", ".999", ".000001", ".1")
]


@pytest.mark.parametrize("lo_ex, hi_ex", [(False, False), (True, False), (False, True), (True, True)])
def test_number_ranges_are_sound_and_complete(lo_ex: bool, hi_ex: bool) -> None:
    for lo, hi in itertools.product([None, -12, -10, -1, 0, 1, 3, 10], [None, -10, -3, -1, 0, 1, 2, 10, 12]):
        if lo is not None and hi is not None and lo > hi:
            continue
        try:
            rx = as_regex(number_range(lo, hi, lo_exclusive=lo_ex, hi_exclusive=hi_ex))
        except ValueError:
            assert lo == hi and (lo_ex or hi_ex)
            continue
        for text in DECIMALS:
            x = float(text)
            inside = (lo is None or (x > lo if lo_ex else x >= lo)) and (hi is None or (x < hi if hi_ex else x <= hi))
            if rx.fullmatch(text):
                assert inside, (lo, hi, lo_ex, hi_ex, text)
            elif inside:
                assert text.startswith("-0") or x == 0 and text.startswith("-"), (lo, hi, lo_ex, hi_ex, text)


def test_text_without_marker_never_contains_it() -> None:
    rng = random.Random(5)
    for marker in ("</think>", "[/THINK]", "aab", "abab"):
        g = Grammar()
        rule = text_without(g, marker, "t")
        states = dict(g.rules)
        for length in range(5):  # every short string over the marker's letters (and one other)
            for chars in itertools.product(sorted(set(marker)) + ["x"], repeat=length):
                text = "".join(chars)
                assert _accepts(states, rule, text) == (marker not in text), (marker, text)
        pieces = [marker[:i] for i in range(1, len(marker) + 1)] + [marker[i:] for i in range(len(marker))] + ["x", "<"]
        for _ in range(3000):  # longer ones built from pieces of the marker, where overlaps hide
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
            assert _accepts(states, rule, text) == (marker not in text), (marker, text)


def _accepts(rules: dict[str, str], start: str, text: str) -> bool:
    """Run the right-linear state rules of `text_without` on `text`."""
    state = start
    for ch in text:
        nxt = None
        for alt in rules[state].split(" | "):
            alt = alt.strip()
            if alt == '""':
                continue
            head, target = alt.rsplit(" ", 1)
            if head.startswith("[^"):
                excluded = re.compile(head).fullmatch(ch) is None
                if not excluded:
                    nxt = target
            elif head.strip('"') == ch:
                nxt = target
                break
        if nxt is None:
            return False
        state = nxt
    return True


REFUSED = [
    ({"type": "string", "pattern": "^(a)\\1$"}, ("pattern",)),
    ({"type": "string", "pattern": "\\bword"}, ("pattern",)),
    ({"type": "string", "pattern": "^a$", "format": "email"}, ("format",)),
    ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}}, ("properties", "a", "multipleOf")),
    ({"type": "array", "uniqueItems": True}, ("uniqueItems",)),
    ({"type": "array", "items": [{"type": "string"}]}, ("items",)),
    ({"not": {}}, ("not",)),
    ({"anyOf": [{"type": "string"}], "minLength": 2}, ("minLength",)),
    ({"oneOf": [{"type": "object"}, {"type": "object"}]}, ("oneOf",)),
    ({"allOf": [{"type": "object"}, {"type": "object"}]}, ("allOf",)),
    ({"$ref": "#/$defs/missing"}, ("$ref",)),
    ({"$defs": {"a": {"type": "string", "format": "duration"}}, "$ref": "#/$defs/a"}, ("$defs", "a", "format")),
    ({"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 0.9}, ("exclusiveMinimum",)),
    ({"type": "integer", "minimum": 5, "maximum": 4}, ("minimum",)),
    ({"type": "string", "minLength": 5, "maxLength": 2}, ("minLength",)),
    ({"type": "object", "required": ["x"], "additionalProperties": False}, ("required",)),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1}, ("maxProperties",)),
    ({"type": ["string", "potato"]}, ("type",)),
    (False, ()),
    ({"minLength": 1, "minimum": 2}, ()),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, ("propertyNames",)),
]


@pytest.mark.parametrize("schema, path", REFUSED)
def test_refusals_name_the_keyword(schema: object, path: tuple) -> None:
    with pytest.raises(SchemaError) as info:
        compile_schema(schema)
    assert info.value.path == path


ACCEPTED = [
    {},
    True,
    # a record as zod writes it (Claude Code's TaskCreate.metadata): every key is a string anyway
    {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}},
    {
        "type": "object",
        "title": "T",
        "description": "d",
        "x-vendor": 1,
        "$schema": "https://json-schema.org/draft/2020-12/schema",
    },
    {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Maybe"},
    {"type": "integer", "multipleOf": 1},
    {"type": "object", "properties": {"a": {"type": "number", "minimum": 0.5, "maximum": 9.5}}},
    {
        "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        "discriminator": {"propertyName": "t"},
        "$defs": {
            "a": {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]},
            "b": {"type": "object", "properties": {"t": {"const": "b"}}, "required": ["t"]},
        },
    },
    {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 1, "maxItems": 3, "items": {"type": "string"}},
    {"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1, "maxProperties": 2},
    {"type": "integer", "minimum": -1e300, "maximum": 1e300},
    {"type": "integer", "exclusiveMinimum": True, "minimum": 0},  # draft 4 spelling
    {"type": "string", "anyOf": [{"maxLength": 2}, {"format": "date"}]},
]


@pytest.mark.parametrize("schema", ACCEPTED)
def test_accepted_schemas_compile(schema: object) -> None:
    g, rule = compile_schema(schema)
    text = g.text(rule)
    assert rule in text
    for name in re.findall(r"^([a-zA-Z0-9-]+) ::=", text, re.MULTILINE):
        assert name in g.rules
