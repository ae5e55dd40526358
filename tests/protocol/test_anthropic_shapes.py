"""Anthropic's shapes without a model: the billing header pinned, a failure mid-stream as Anthropic's
`error` event, a response's stop reasons, and Claude Code's request shape read as sent."""

from __future__ import annotations

from lmsp_tray.errors import ModelCrashed
from lmsp_tray.http.anthropic.messages import encode
from lmsp_tray.protocol.anthropic import normalize_billing_header, parse_message_create
from lmsp_tray.protocol.anthropic_events import MessageStream, stop_reason
from lmsp_tray.protocol.events import ResponseAssembler, error_event
from lmsp_tray.protocol.requests import Message


def test_billing_header_is_pinned_and_nothing_else() -> None:
    one = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;You are Claude Code."
    two = "x-anthropic-billing-header: cc_version=2.1.101.7c0; cc_entrypoint=cli; cch=09d3e;You are Claude Code."
    assert normalize_billing_header(one) == normalize_billing_header(two)
    assert normalize_billing_header(one) == (
        "x-anthropic-billing-header: cc_version=2.1.101.fff; cc_entrypoint=cli; cch=fffff;You are Claude Code."
    )
    newer = "x-anthropic-billing-header: cc_version=2.1.220.473; cc_entrypoint=sdk-cli;\nRules: cch=abc;"
    assert normalize_billing_header(newer) == (
        "x-anthropic-billing-header: cc_version=2.1.220.fff; cc_entrypoint=sdk-cli;\nRules: cch=abc;"
    )
    for other in ("You are helpful. cch=a5145;", " x-anthropic-billing-header: cch=a5145;", ""):
        assert normalize_billing_header(other) == other


def test_a_failure_after_the_first_byte_is_an_error_event() -> None:
    asm = ResponseAssembler("m")
    stream = MessageStream("claude-x")
    events = [out for event in asm.start() + asm.text("Hi") for out in stream.feed(event)]
    assert [e.name for e in events] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert events[0].data["message"]["model"] == "claude-x"
    problem = ModelCrashed("The model process stopped.").to_problem()
    (failed,) = [out for event in asm.fail(problem) for out in stream.feed(event)][-1:]
    assert encode(failed) == (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":'
        b'"The model process stopped."}}\n\n'
    )
    # The event stream's own failure (an LMSP `error` event) is written the same way.
    assert encode(error_event(9, problem)) == encode(failed)


def test_stop_reasons() -> None:
    asm = ResponseAssembler("m")
    asm.start()
    asm.text("x")
    asm.complete(3, 1, stop_sequence="\n\n")
    assert stop_reason(asm.response()) == ("stop_sequence", "\n\n")
    asm = ResponseAssembler("m")
    asm.start()
    asm.function_call_start("f")
    asm.complete(3, 1)
    assert stop_reason(asm.response()) == ("tool_use", None)
    asm = ResponseAssembler("m")
    asm.start()
    asm.incomplete("max_output_tokens", 3, 1)
    assert stop_reason(asm.response()) == ("max_tokens", None)


def test_claude_codes_request_shape_is_read() -> None:
    """What Claude Code 2.1.197 sends with `-p`: a system message between turns, adaptive thinking,
    context_management, output_config.effort, metadata, cache_control on blocks."""
    parsed = parse_message_create(
        {
            "model": "m",
            "max_tokens": 32000,
            "stream": True,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"},
                {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}}],
                },
                {"role": "system", "content": "Available agent types for the Agent tool: ..."},
            ],
            "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": "u"},
        }
    )
    assert [(m.role, m.text) for m in parsed.request.items if isinstance(m, Message)][1:] == [
        ("user", "Say hi"),
        ("system", "Available agent types for the Agent tool: ..."),
    ]
    assert parsed.thinking is None and [t.name for t in parsed.request.tools] == ["Bash"]
