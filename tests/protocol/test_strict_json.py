"""The request decoder's depth bound: exactly `MAX_JSON_DEPTH` levels pass, one more is refused, and the
level-by-level walk that measures it counts as the node-by-node one did."""

from __future__ import annotations

import json

import pytest

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.strict_json import MAX_JSON_DEPTH, loads, nesting


def test_nesting_counts_lists_and_objects_and_stops_past_the_limit() -> None:
    assert [nesting(v) for v in (1, "x", None, {}, [], [1, "a"], {"a": [1, {"b": []}]}, [[[[]]]])] == [
        0,
        0,
        0,
        1,
        1,
        1,
        4,
        4,
    ]
    assert nesting([{"a": 1}, [[{"b": [2]}]], 3]) == 5  # the deepest branch, wherever it sits
    deep: list = []
    inner = deep
    for _ in range(199):
        inner.append([])
        inner = inner[0]
    assert nesting(deep) == 200
    assert nesting(deep, 64) == 65  # stops one level past the limit
    assert nesting([[1]], 64) == 2


@pytest.mark.parametrize("kind", ["list", "object"])
def test_exactly_the_limit_passes_and_one_more_is_refused(kind: str) -> None:
    def nested(levels: int) -> bytes:
        if kind == "list":
            return ("[" * levels + "]" * levels).encode()
        return ('{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)).encode()

    assert nesting(loads(nested(MAX_JSON_DEPTH))) == MAX_JSON_DEPTH
    with pytest.raises(InvalidRequest, match="nested deeper than 64"):
        loads(nested(MAX_JSON_DEPTH + 1))


def test_a_wide_body_of_many_brackets_is_walked_once_and_passes() -> None:
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": str(i)}]} for i in range(20_000)]}
    assert loads(json.dumps(body).encode()) == body
