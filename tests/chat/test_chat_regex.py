"""`pattern` to GBNF (`chat.regex`): what is parsed, the length bounds beside minLength/maxLength, refusals.

Decoding under these rules with real llama.cpp is checked over HTTP (`test_structured_http.py`,
the "patterns" schema, every output validated by `jsonschema`; `test_openai_chat.py` with a
pydantic model of constrained strings).
"""

from __future__ import annotations

import pytest

from lmsp_tray.chat.regex import RegexError, length_bounds, parse, to_gbnf


@pytest.mark.parametrize(
    "pattern, bounds",
    [
        ("^[A-Z]{2}-\\d{3}$", (6, 6)),
        ("^(yes|no|maybe)\\.?$", (2, 6)),
        ("abc", (3, 3)),
        ("^a+$", (1, None)),
        ("^(?:ab){2,3}c*$", (4, None)),
        ("^(?<year>\\d{4})-(?<month>\\d{2})$", (7, 7)),
        ("^[\\w.-]{1,8}@x\\.io$", (6, 13)),
        ("^\\u00e9\\x41$", (2, 2)),
        ("^a{2,}?$", (2, None)),
        ("^$", (0, 0)),
    ],
)
def test_parses_the_common_subset(pattern: str, bounds: tuple[int, int | None]) -> None:
    tree = parse(pattern)
    assert length_bounds(tree) == bounds
    assert to_gbnf(tree)


def test_json_escapes_in_the_grammar() -> None:
    # A quote or backslash in the text is written escaped inside the JSON string.
    assert to_gbnf(parse('^"$')) == '"\\\\\\""'
    assert to_gbnf(parse("^\\\\$")) == '"\\\\\\\\"'
    assert to_gbnf(parse("^a\\tb$")) == '("a\\\\tb")'
    # A negated class never lets a raw quote, backslash or control character through.
    rule = to_gbnf(parse("^[^,]$"))
    assert rule.startswith("[^\\x2C") and "\\x22" in rule and "\\x5C" in rule and "\\x00-\\x1F" in rule


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("^(a)\\1$", "back reference"),
        ("^(?=a)a$", "lookaround"),
        ("^(?!a)b$", "lookaround"),
        ("\\bword", "word boundary"),
        ("a^b", "'^' inside"),
        ("^(ab$", "unclosed group"),
        ("^[ab$", "unclosed '['"),
        ("^a{5,2}$", "reversed"),
        ("^a{2000}$", "repetition over"),
        ("^*a$", "nothing to repeat"),
        ("^[[:alpha:]]$", "POSIX class"),
        ("^\\p{L}$", "'\\p'"),
    ],
)
def test_refuses_what_it_cannot_enforce(pattern: str, why: str) -> None:
    with pytest.raises(RegexError, match="cannot be enforced") as err:
        to_gbnf(parse(pattern))
    assert why in str(err.value)
