"""Chat templates: built-ins per architecture, the sandbox, and template errors."""

from __future__ import annotations

import pytest

from lmsp_tray.engine.templates import BUILTIN_TEMPLATES, ChatTemplate, RenderedPast, builtin_template_name
from lmsp_tray.errors import InvalidRequest

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def test_gemma_builtin_folds_system_into_first_user_turn() -> None:
    t = ChatTemplate(BUILTIN_TEMPLATES["gemma"], "gemma", bos_token="<bos>", eos_token="<eos>")
    assert t.render(CONVO) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )  # the leading <bos> is left to tokenization


def test_llama3_and_chatml_and_llama2() -> None:
    l3 = ChatTemplate(BUILTIN_TEMPLATES["llama3"], "llama3", bos_token="<|begin_of_text|>")
    assert l3.render(CONVO[:2]) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    cm = ChatTemplate(BUILTIN_TEMPLATES["chatml"], "chatml")
    assert cm.render(CONVO[1:2]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    l2 = ChatTemplate(BUILTIN_TEMPLATES["llama2"], "llama2", bos_token="<s>", eos_token="</s>")
    assert l2.render(CONVO) == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"


@pytest.mark.parametrize(
    "arch, tokens, expected",
    [
        ("gemma3", set(), "gemma"),
        ("gemma2", set(), "gemma"),
        ("gemma", set(), "gemma"),
        ("llama", {"<|start_header_id|>"}, "llama3"),
        ("llama", set(), "llama2"),
        ("qwen2", {"<|im_start|>"}, "chatml"),
        ("qwen3", set(), "chatml"),
        ("phi3", set(), "chatml"),
    ],
)
def test_builtin_choice(arch: str, tokens: set[str], expected: str) -> None:
    assert builtin_template_name(arch, tokens.__contains__) == expected


def test_sandbox_blocks_python_internals() -> None:
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", "model")
    with pytest.raises(InvalidRequest):
        evil.render(CONVO)


def test_sandbox_is_immutable() -> None:
    t = ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}{{ messages|length }}", "model")
    with pytest.raises(InvalidRequest):
        t.render(CONVO)


def test_raise_exception_becomes_invalid_request() -> None:
    t = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}", "model")
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        t.render(CONVO)


def test_hf_helpers_available() -> None:
    t = ChatTemplate(
        "{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}",
        "model",
    )
    assert t.render([{"role": "user", "content": "ж"}]) == '{"role": "user", "content": "ж"}|4user'


def test_bad_template_source_is_rejected_at_compile() -> None:
    with pytest.raises(ValueError):
        ChatTemplate("{% for %}", "model")


def test_a_render_stops_past_at_most_with_the_start_of_the_whole_text() -> None:
    t = ChatTemplate(BUILTIN_TEMPLATES["gemma"], "gemma", bos_token="<bos>", eos_token="<eos>")
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20} for i in range(400)]
    whole = t.render(long)
    with pytest.raises(RenderedPast) as past:
        t.render(long, at_most=1000)
    head = past.value.head
    assert 1000 <= len(head) < len(whole) // 10 and whole.startswith(head)  # the BOS left out, as in `render`
    assert t.render(long, at_most=len(whole) + 1) == whole  # shorter than at_most: the whole text
    assert t.render(CONVO, at_most=10_000) == t.render(CONVO)


def test_a_template_error_past_at_most_is_not_reached() -> None:
    source = "{% for m in messages %}{% if loop.index > 100 %}{{ raise_exception('too many') }}{% endif %}"
    t = ChatTemplate(source + "{{ m['content'] }}{% endfor %}", "model")
    many = [{"role": "user", "content": "x" * 50}] * 200
    with pytest.raises(InvalidRequest, match="too many"):
        t.render(many)
    with pytest.raises(RenderedPast):  # stopped at its 20th message
        t.render(many, at_most=1000)
