"""Request validation at the edge: liberal shapes accepted, mistakes named precisely."""

from __future__ import annotations

import pytest

from lmsp_tray.errors import InvalidRequest, UnsupportedCapability
from lmsp_tray.protocol.requests import FunctionCall, FunctionCallOutput, Message, parse_response_create


def test_plain_string_input_and_defaults() -> None:
    req = parse_response_create({"model": "m", "input": "hi"})
    assert req.items == [Message("user", "hi")]
    assert req.stream is False and req.store is False and req.tool_choice == "auto"
    assert req.max_output_tokens is None and req.stop == []


def test_items_of_every_kind() -> None:
    req = parse_response_create(
        {
            "model": "m",
            "instructions": "sys",
            "input": [
                {"role": "developer", "content": "dev"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "42"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
            ],
            "extensions": {"lmsp_tray": {"seed": 3, "stop": "END", "top_k": 5}, "other_vendor": {"x": 1}},
        }
    )
    assert req.items == [
        Message("system", "sys"),
        Message("system", "dev"),
        Message("user", "ab"),
        FunctionCall("call_1", "f", "{}"),
        FunctionCallOutput("call_1", "42"),
    ]
    assert req.seed == 3 and req.stop == ["END"] and req.top_k == 5


def test_text_format_alias_for_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = parse_response_create(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}}
    )
    assert req.json_schema == schema
    req = parse_response_create(
        {
            "model": "m",
            "input": "x",
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        }
    )
    assert req.json_schema == schema


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": 1.5}, "max_output_tokens"),
        ({"model": "m", "input": "x", "store": 1}, "store"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "m", "input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"model": "m", "input": "x", "response_format": {"type": "json_schema"}}, "response_format"),
        ({"model": "m", "input": "x", "extensions": {"lmsp_tray": {"stop": [""]}}}, "extensions.lmsp_tray.stop"),
        ({"model": "", "input": "x"}, "model"),
    ],
)
def test_errors_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_response_create(body)
    assert info.value.param == param
    assert info.value.detail


def test_reserved_content_types() -> None:
    for kind in ("input_file", "input_video"):
        with pytest.raises(UnsupportedCapability) as info:
            parse_response_create({"model": "m", "input": [{"role": "user", "content": [{"type": kind}]}]})
        assert info.value.param == "input[0].content[0]" and kind in info.value.detail
    # input_image is taken (an extension of LMSP 1.0), as bytes only
    with pytest.raises(InvalidRequest) as bad:
        parse_response_create({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]})
    assert bad.value.param == "input[0].content[0].image_url"
    url = {"type": "input_image", "image_url": "https://example.com/a.png"}
    with pytest.raises(InvalidRequest) as remote:
        parse_response_create({"model": "m", "input": [{"role": "user", "content": [url]}]})
    assert remote.value.param == "input[0].content[0]" and "not fetched" in remote.value.detail
    # input_audio likewise (OpenAI's shape), as base64 bytes
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    parsed = parse_response_create({"model": "m", "input": [{"role": "user", "content": [audio]}]})
    assert [(m.param, m.data) for m in parsed.images] == [("input[0].content[0]", b"RIFF")]


def test_a_requests_media_are_found_once_and_again_in_a_copy() -> None:
    """The service asks for a request's media five times before its first token; a long history is walked
    once (the list is kept), and a copy made with other items finds its own."""
    import dataclasses

    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    parsed = parse_response_create({"model": "m", "input": [{"role": "user", "content": [audio]}]})
    assert parsed.images is parsed.images and len(parsed.images) == 1
    assert dataclasses.replace(parsed, items=[Message("user", "hi")]).images == []


# Items of every shape, good and bad, that a long `input` (validated in batches as `PlainInputItem`s first)
# must take or refuse exactly as a short one (validated whole, `MessageItem`'s validator wording errors).
LONG_INPUT_GOOD = [
    {"role": "developer", "content": "dev"},
    {"role": "user", "content": ""},
    {"role": "assistant", "content": [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "r"}]},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "x"}, {"type": "text", "text": "y"}],
    },
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": [{"type": "output_text", "text": "4"}, {"text": "2"}]},
    {"type": "reasoning", "summary": []},
]
LONG_INPUT_BAD = [
    {"role": "user", "content": 5},
    {"role": "user", "content": None},
    {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "ok"}, {"type": "image_url", "image_url": "u"}]},
    {"role": "user", "content": [{"type": "input_text"}]},
    {"role": "user", "content": [{"type": "nope", "text": "x"}]},
    {"role": "user", "content": ["plain"]},
    {"role": "robot", "content": "x"},
    {"role": "robot", "content": [{"type": "input_file"}]},  # the role's error comes first, as in a short input
    {"role": "user"},
    {"type": "function_call_output", "call_id": "c1", "output": [{"text": 2}]},
    {"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
    {"type": "message", "role": "user", "content": "x", "extra": 1, "id": 7},
]


def outcome(items: list) -> object:
    try:
        return parse_response_create({"model": "m", "input": items}).items
    except (InvalidRequest, UnsupportedCapability) as exc:
        return (type(exc), exc.code, exc.param, exc.detail)


@pytest.mark.parametrize("item", LONG_INPUT_GOOD + LONG_INPUT_BAD)
def test_a_long_input_takes_and_refuses_each_item_as_a_short_one_does(item: dict) -> None:
    from lmsp_tray.protocol.requests import INPUT_BATCH

    filler = [{"role": "user", "content": f"m{i}"} for i in range(2 * INPUT_BATCH)]
    at = INPUT_BATCH + 5
    short, long = outcome([item]), outcome([*filler[:at], item, *filler[at:]])
    if isinstance(short, tuple):
        assert isinstance(long, tuple), item
        assert long == (
            *short[:2],
            short[2].replace("input[0]", f"input[{at}]"),
            short[3].replace("input[0]", f"input[{at}]"),
        )
    else:
        assert long[at : at + len(short)] == short and len(long) == len(filler) + len(short)
