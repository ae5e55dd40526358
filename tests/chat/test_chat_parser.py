"""The output parser: each family's call format, thinking, malformed output, any split of the text."""

from __future__ import annotations

import json

import pytest

from lmsp_tray.chat.dialects import HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS
from lmsp_tray.chat.parser import Op, OutputParser, ParserConfig, apply
from lmsp_tray.protocol.events import ResponseAssembler

NAMES = frozenset({"get_weather", "add"})
THINK = ("<think>", "</think>")
QWEN = ParserConfig(think=THINK, syntax=HERMES, tool_names=NAMES)
LLAMA = ParserConfig(syntax=LLAMA3, tool_names=NAMES)
MIS = ParserConfig(syntax=MISTRAL, tool_names=NAMES)
MIS11 = ParserConfig(syntax=MISTRAL_ARGS, tool_names=NAMES)
R1 = ParserConfig(think=THINK, start_in_think=True)


def parse(cfg: ParserConfig, text: str, *, live: bool = False, size: int | None = None) -> list[Op]:
    parser = OutputParser(cfg, constrained=live)
    pieces = [text] if size is None else [text[i : i + size] for i in range(0, len(text), size)]
    ops: list[Op] = []
    for piece in pieces:
        ops += parser.feed(piece)
    ops += parser.finish()
    merged: list[Op] = []
    for kind, payload in ops:  # deltas of one kind in a row are one piece of text
        if merged and kind == merged[-1][0] and kind in ("text", "reasoning", "args"):
            merged[-1] = (kind, merged[-1][1] + payload)
        else:
            merged.append((kind, payload))
    return merged


def call(name: str, args: str) -> list[Op]:
    return [("call", name), ("args", args), ("end", "")]


CASES = [
    # plain text passes through untouched, blanks included
    (QWEN, "Hello world", [("text", "Hello world")]),
    (QWEN, "  spaced  out \n", [("text", "  spaced  out \n")]),
    (QWEN, "a < b and x <tool_ca", [("text", "a < b and x <tool_ca")]),
    # thinking (Qwen3 / R1)
    (QWEN, "<think>\nhmm, ok\n</think>\n\nAnswer.", [("reasoning", "hmm, ok"), ("text", "Answer.")]),
    (QWEN, "<think>cut short", [("reasoning", "cut short")]),
    (R1, 'inside\n</think>\n\n{"a": 1}', [("reasoning", "inside"), ("text", '{"a": 1}')]),
    (R1, "</think>Only the answer", [("text", "Only the answer")]),
    # Hermes / Qwen calls
    (
        QWEN,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        call("get_weather", '{"city": "Paris"}'),
    ),
    (
        QWEN,
        '<think>plan</think>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, "}"]}}\n</tool_call>',
        [("reasoning", "plan"), *call("add", '{"a": 1, "b": [2, "}"]}')],
    ),
    (
        QWEN,
        'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>',
        [("text", "Let me check."), *call("get_weather", '{"city": "A"}')],
    ),
    (
        QWEN,
        (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>\n'
            '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        ),
        call("get_weather", '{"city": "A"}') + call("add", '{"a": 1}'),
    ),
    (QWEN, '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>', call("add", '{"a": 2}')),
    (QWEN, '<tool_call>{"name": "add", "arguments": {"a": 1}}', call("add", '{"a": 1}')),  # no closing tag
    # malformed: the text stays a message, nothing raises
    (
        QWEN,
        '<tool_call>{"name": "get_weather", "arguments": {"city": "A"',  # cut short
        [("text", '<tool_call>{"name": "get_weather", "arguments": {"city": "A"')],
    ),
    (
        QWEN,
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call> after',
        [("text", '<tool_call>{"name": "nope", "arguments": {}}</tool_call> after')],
    ),
    (QWEN, "<tool_call>{bad json}</tool_call> tail", [("text", "<tool_call>{bad json}</tool_call> tail")]),
    (QWEN, "<tool_call>not json at all", [("text", "<tool_call>not json at all")]),
    (
        QWEN,
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
        [("text", '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>')],
    ),
    (QWEN, "<tool_call>", [("text", "<tool_call>")]),
    # Llama 3: bare JSON at the start, or after <|python_tag|>
    (LLAMA, '{"name": "get_weather", "parameters": {"city": "X"}}', call("get_weather", '{"city": "X"}')),
    (LLAMA, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "X"}}', call("get_weather", '{"city": "X"}')),
    (
        LLAMA,
        '{"name": "get_weather", "parameters": {"city": "X"}}; {"name": "add", "parameters": {"a": 2}}',
        call("get_weather", '{"city": "X"}') + call("add", '{"a": 2}'),
    ),
    (LLAMA, '{"answer": 42}', [("text", '{"answer": 42}')]),
    (
        LLAMA,
        'Sure: {"name": "get_weather", "parameters": {}}',
        [("text", 'Sure: {"name": "get_weather", "parameters": {}}')],
    ),
    (LLAMA, '<|python_tag|>brave_search.call(query="x")', [("text", '<|python_tag|>brave_search.call(query="x")')]),
    (
        LLAMA,
        '{"name": "get_weather", "parameters": {"city"',
        [("text", '{"name": "get_weather", "parameters": {"city"')],
    ),
    # Mistral
    (
        MIS,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "X"}}, {"name": "add", "arguments": {"a": 1}}]',
        call("get_weather", '{"city": "X"}') + call("add", '{"a": 1}'),
    ),
    (
        MIS,
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}] and then text',
        call("add", '{"a": 1}') + [("text", "and then text")],
    ),
    (MIS, "[TOOL_CALLS]oops", [("text", "[TOOL_CALLS]oops")]),
    (
        MIS11,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "X"}[TOOL_CALLS]add[ARGS]{"a": 1}',
        call("get_weather", '{"city": "X"}') + call("add", '{"a": 1}'),
    ),
    (MIS11, "[TOOL_CALLS]unknown[ARGS]{}", [("text", "[TOOL_CALLS]unknown[ARGS]{}")]),
    # calls are not parsed at all when tools are off
    (
        ParserConfig(think=THINK),
        '<tool_call>{"name": "add", "arguments": {}}</tool_call>',
        [("text", '<tool_call>{"name": "add", "arguments": {}}</tool_call>')],
    ),
]


CUT_SHORT = {  # under a grammar a call is streamed as it comes: cut short, it stays a (partial) call
    '<tool_call>{"name": "get_weather", "arguments": {"city": "A"': [("call", "get_weather"), ("args", '{"city": "A"')],
    '{"name": "get_weather", "parameters": {"city"': [("call", "get_weather"), ("args", '{"city"')],
}


@pytest.mark.parametrize("cfg, text, expected", CASES)
@pytest.mark.parametrize("live", [False, True])
def test_formats_and_malformed_output(cfg: ParserConfig, text: str, expected: list[Op], live: bool) -> None:
    whole = parse(cfg, text, live=live)
    if live and text in CUT_SHORT:
        assert whole == CUT_SHORT[text]
    elif live and any(kind == "call" for kind, _ in expected):
        # A constrained call streams its arguments raw; the result is the same JSON.
        assert len(whole) == len(expected)
        for (k1, p1), (k2, p2) in zip(whole, expected):
            assert k1 == k2
            if k1 == "args":
                assert json.loads(p1) == json.loads(p2)
            elif k1 != "text":
                assert p1 == p2
    else:
        assert whole == expected
    for size in range(1, 9):  # however the text is split into deltas, the result is the same
        assert parse(cfg, text, live=live, size=size) == whole, size


def test_live_call_streams_arguments_and_may_be_cut_short() -> None:
    parser = OutputParser(QWEN, constrained=True)
    ops = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert ops == [("call", "get_weather"), ("args", '{"ci')]
    assert parser.feed('ty": "Pa') == [("args", 'ty": "Pa')]
    assert parser.finish() == []  # cut by the token limit: the assembler closes it as it stands


def test_holds_back_only_possible_markers() -> None:
    parser = OutputParser(QWEN)
    assert parser.feed("Hello <to") == [("text", "Hello")]
    assert parser.feed("y> and") == [("text", " <toy> and")]
    assert parser.feed(" <thi") == []
    assert parser.feed("nk>deep") == [("reasoning", "deep")]


def test_ops_drive_the_assembler() -> None:
    asm = ResponseAssembler("m")
    asm.start()
    text = '<think>plan</think><tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    parser = OutputParser(QWEN, constrained=True)
    events = apply(asm, parser.feed(text) + parser.finish())
    events += asm.complete(3, 4)
    names = [e.name for e in events]
    assert names.count("response.output_item.added") == 2
    assert "response.reasoning_summary_text.delta" in names
    assert "response.function_call_arguments.delta" in names
    out = asm.response()["output"]
    assert out[0]["type"] == "reasoning" and out[0]["summary"] == [{"type": "summary_text", "text": "plan"}]
    assert out[1]["type"] == "function_call" and out[1]["arguments"] == '{"a": 1}' and out[1]["name"] == "add"
    assert [e.id for e in events] == sorted(e.id for e in events)


def test_passthrough_without_markers() -> None:
    parser = OutputParser(ParserConfig())
    assert parser.passthrough
    assert parser.feed("<think>x") == [("text", "<think>x")] and parser.finish() == []
