"""Families from chat templates, conversations rendered per family, the call trigger, UTF-8 under a grammar."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp
import pytest
from chat_templates import DEEPSEEK_R1, LLAMA31, MISTRAL, QWEN3
from gguf_factory import CHATML_TEMPLATE, write_tiny_gguf

from lmsp_tray.chat import dialects
from lmsp_tray.engine.templates import BUILTIN_TEMPLATES, ChatTemplate
from lmsp_tray.engine.trigger import CallTrigger
from lmsp_tray.protocol.requests import FunctionCall, FunctionCallOutput, Message, Tool
from lmsp_tray.runner.textstream import GrammarUTF8Decoder, TextStream

TOOL = Tool("get_weather", "Weather now.", {"type": "object", "properties": {"city": {"type": "string"}}})
HISTORY = [
    Message("system", "Be brief."),
    Message("user", "Weather in Paris?"),
    FunctionCall("call_01ABC", "get_weather", '{"city": "Paris"}'),
    FunctionCallOutput("call_01ABC", '{"temp": 17}'),
]


def render(source: str | None, builtin: str = "chatml", **kwargs: object) -> str:
    dialect = dialects.detect(source)
    template = (
        ChatTemplate(source, "model", "<s>", "</s>")
        if source
        else ChatTemplate(BUILTIN_TEMPLATES[builtin], builtin, "<bos>", "<eos>")
    )
    extra = None if dialect.native else dialects.instruction([TOOL], "auto")
    messages = dialects.conversation(HISTORY, dialect, extra_system=extra)
    tools = dialects.tool_specs([TOOL]) if dialect.native else None
    return template.render(messages, tools=tools, add_generation_prompt=True, **kwargs)


def test_families_are_recognised() -> None:
    assert dialects.detect(QWEN3).syntax.family == "hermes" and dialects.detect(QWEN3).native
    assert dialects.detect(QWEN3).think == ("<think>", "</think>") and dialects.detect(QWEN3).thinking_switch
    assert dialects.detect(LLAMA31).syntax.family == "llama3" and dialects.detect(LLAMA31).think is None
    assert dialects.detect(MISTRAL).syntax.family == "mistral"
    assert dialects.detect("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}").syntax.family == "mistral-args"
    r1 = dialects.detect(DEEPSEEK_R1)
    assert not r1.native and r1.think == ("<think>", "</think>")
    for plain in (None, CHATML_TEMPLATE, BUILTIN_TEMPLATES["gemma"]):
        d = dialects.detect(plain)
        assert not d.native and d.syntax.family == "hermes" and d.think is None


def test_qwen3_renders_tools_calls_and_results() -> None:
    text = render(QWEN3)
    assert "<tools>\n" in text and '"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 17}\n</tool_response><|im_end|>' in text
    assert render(QWEN3, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llama31_renders_json_call_and_ipython_result() -> None:
    text = render(LLAMA31)
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>" in text
    assert 'Respond in the format {"name": function name, "parameters"' in text


def test_mistral_gets_nine_character_call_ids() -> None:
    text = render(MISTRAL)
    ids = {json.loads(part.split("[/TOOL_RESULTS]")[0])["call_id"] for part in text.split("[TOOL_RESULTS]")[1:]}
    [call_id] = ids
    assert len(call_id) == 9 and call_id.isalnum()
    assert f'"id": "{call_id}"' in text


def test_templates_without_tools_get_the_builtin_instruction() -> None:
    text = render(None, "gemma")
    assert text.count("<tools>\n") == 1 and "<tool_call></tool_call> XML tags" in text
    assert "<start_of_turn>model\n<tool_call>\n" in text  # the earlier call, as text
    assert '<start_of_turn>user\n<tool_response>\n{"temp": 17}\n</tool_response>' in text
    assert "You must call the function 'get_weather'" in dialects.instruction(
        [TOOL], {"type": "function", "name": "get_weather"}
    )


def test_trigger_fires_at_the_marker_outside_thinking_once() -> None:
    trig = CallTrigger({"<tool_call>": "after"}, ("<think>", "</think>"))
    assert trig(b"Let me think: <think>maybe <tool_") is None
    assert trig(b"call> no") is None  # inside the thought: not a call
    assert trig(b"</think>\nOK ") is None
    assert trig(b"<tool_") is None
    assert trig(b"call>\n") == "after" and trig.fired
    assert trig(b"<tool_call>") is None  # once only; the rule allows more calls itself
    r1 = CallTrigger({"<tool_call>": "after"}, ("<think>", "</think>"), in_think=True)
    assert r1(b"<tool_call>") is None and r1(b"</think><tool_call>") == "after"
    late = CallTrigger({"[TOOL_CALLS]": "m"})
    assert late(b"text [TOOL_CALLS] more") is None  # text after the marker in the same token: not switched on
    assert late(b"x[TOOL_CALLS]") == "m"


def test_grammar_utf8_decoder_matches_python_on_valid_text() -> None:
    text = "aж€🙂日本 héllo"
    data = text.encode()
    for cut in range(1, len(data)):
        stream = TextStream(grammar_utf8=True)
        assert stream.push(data[:cut]) + stream.push(data[cut:]) + stream.flush() == text
    assert GrammarUTF8Decoder().decode(b"\xc1\xa3\xed\xa0\x80\xf4\x90\x80\x80\x80x") == "c\ufffd\ufffd\ufffdx"


def test_llama_grammar_takes_overlong_bytes_at_their_value(tmp_path: Path) -> None:
    """Why constrained text is decoded like llama.cpp does: its grammar accepts C1 A3 as 'c'."""
    path = write_tiny_gguf(tmp_path / "t.gguf")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        byte = {llama_cpp.llama_vocab_get_text(vocab, t): t for t in range(n)}
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, b'root ::= "\\"c\\""', b"root")
        for tok in (byte[b"<0x22>"], byte[b"<0xC1>"]):  # '"' then the lead byte of an overlong 'c'
            llama_cpp.llama_sampler_accept(sampler, tok)
        arr = (llama_cpp.llama_token_data * n)(*[llama_cpp.llama_token_data(t, 0.0, 0.0) for t in range(n)])
        cur = llama_cpp.llama_token_data_array(arr, n, -1, False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(cur))
        allowed = {arr[i].id for i in range(n) if arr[i].logit != float("-inf")}
        assert byte[b"<0xA3>"] in allowed
        llama_cpp.llama_sampler_free(sampler)
    finally:
        llama_cpp.llama_model_free(model)
    stream = TextStream(grammar_utf8=True)
    assert "".join(stream.push(b) for b in (b'"', b"\xc1", b"\xa3", b'"')) + stream.flush() == '"c"'
    plain = TextStream()
    assert "".join(plain.push(b) for b in (b'"', b"\xc1", b"\xa3", b'"')) + plain.flush() != '"c"'


@pytest.mark.parametrize("source", [QWEN3, DEEPSEEK_R1])
def test_reasoning_capability_comes_from_the_template(source: str) -> None:
    from lmsp_tray.chat.capabilities import model_capabilities
    from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry

    entry = ModelEntry("m", Path("/x.gguf"), "custom", 1, info=GGUFInfo(chat_template=source))
    assert "reasoning" in model_capabilities(entry)
    plain = ModelEntry("p", Path("/y.gguf"), "custom", 1, info=GGUFInfo(chat_template=LLAMA31))
    assert model_capabilities(plain) == ["text", "streaming", "tools", "structured_output"]
    assert model_capabilities(ModelEntry("e", Path("/z.gguf"), "custom", 1, error="bad header")) == []


class _Model:
    """Just what a plan reads from a loaded model: its template and marker tokens."""

    sliding_window = False

    def __init__(self, source: str | None, builtin: str = "chatml") -> None:
        self.template = (
            ChatTemplate(source, "model", "<s>", "</s>")
            if source
            else ChatTemplate(BUILTIN_TEMPLATES[builtin], builtin, "<s>", "</s>")
        )

    def find_token(self, text: str) -> int | None:
        return {"<|python_tag|>": 7}.get(text)

    def is_control(self, token: int) -> bool:
        return True


def _plan(source: str | None, **body: object):
    from lmsp_tray.chat.plan import build_plan, prepare
    from lmsp_tray.protocol.requests import parse_response_create

    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    request = parse_response_create({"model": "m", "input": "hi", "tools": [weather], **body})
    return build_plan(_Model(source), request, prepare(request))


def test_plans_choose_grammar_parallelism_and_thinking() -> None:
    auto = _plan(QWEN3)
    assert auto.lazy_roots == {"<tool_call>": "h-after"} and "h-after ::=" in (auto.grammar or "")
    assert auto.parser_config.think == ("<think>", "</think>")
    assert "h-call)*" in (_plan(QWEN3, tool_choice="required").grammar or "")  # Qwen calls in parallel
    assert "h-call)*" not in (_plan(QWEN3, tool_choice="required", parallel_tool_calls=False).grammar or "")
    assert "h-call)*" not in (_plan(None, tool_choice="required").grammar or "")  # built-in instruction: one
    assert "h-call)*" in (_plan(None, tool_choice="required", parallel_tool_calls=True).grammar or "")
    named = _plan(QWEN3, tool_choice={"type": "function", "name": "get_weather"}).grammar or ""
    assert "h-call)*" not in named and "think ::=" in named  # Qwen3 may think first
    assert (
        _plan(QWEN3, tool_choice="none").grammar is None
        and _plan(QWEN3, tool_choice="none").parser_config.syntax is None
    )
    llama = _plan(LLAMA31, tool_choice="required")
    assert llama.visible_tokens == frozenset({7})  # <|python_tag|> is a control token the parser must see
    off = _plan(DEEPSEEK_R1, extensions={"lmsp_tray": {"reasoning": False}}, response_format={"type": "json_object"})
    assert off.prompt.endswith("<think>\n</think>\n\n") and "think" not in (off.grammar or "")
    on = _plan(DEEPSEEK_R1, response_format={"type": "json_object"})
    assert on.parser_config.start_in_think and "root ::= think" in (on.grammar or "")
