"""`text_floor`: what it counts of a conversation, and what it leaves out (a template may drop it)."""

from __future__ import annotations

from lmsp_tray.protocol.images import ImageInput
from lmsp_tray.protocol.requests import FunctionCallOutput, Message, ResponseRequest
from lmsp_tray.serving.input_bounds import text_floor


def request(*items: Message | FunctionCallOutput) -> ResponseRequest:
    return ResponseRequest(model="m", items=list(items))


def test_system_and_user_text_over_the_longest_piece_rounded_up() -> None:
    conversation = request(Message("system", "a" * 10), Message("user", "b" * 11))
    assert text_floor(conversation, 4) == 6  # 21 characters, at most 4 a token
    assert text_floor(conversation, 21) == 1
    assert text_floor(conversation, 0) == 21  # a vocabulary that reports nothing still bounds by characters


def test_what_a_template_may_drop_or_shrink_is_not_counted() -> None:
    conversation = request(
        Message("user", "   padded   "),  # trimmed by templates: 6 characters
        Message("assistant", "x" * 1000),  # its reasoning may be dropped
        FunctionCallOutput("c1", "y" * 1000),
        Message("user", "z" * 1000 + "<__media__>", images=(ImageInput(b"png", "input[3]"),)),
    )
    assert text_floor(conversation, 1) == 6
