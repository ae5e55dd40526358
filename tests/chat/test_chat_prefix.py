"""The stable prefix of a rendered prompt: its system messages and tools, as every conversation with
them renders them (what a sliding-window model checkpoints for the next conversation)."""

from __future__ import annotations

from lmsp_tray.chat.prefix import MIN_CHARS, stable_chars
from lmsp_tray.engine.templates import BUILTIN_TEMPLATES, ChatTemplate

SYSTEM = "You are a careful assistant. " * 60  # ~1,700 characters
TOOLS_AFTER = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
)


def rendered(template: ChatTemplate, messages: list[dict], tools: list | None = None) -> tuple[str, int]:
    prompt = template.render(messages, tools=tools)
    return prompt, stable_chars(template, messages, tools, prompt)


def test_the_stable_prefix_is_the_system_prompt_as_any_next_conversation_renders_it() -> None:
    """Gemma folds the system prompt into the first user turn: the prefix ends right after it, and two
    conversations with the same system prompt both start with exactly that text."""
    gemma = ChatTemplate(BUILTIN_TEMPLATES["gemma"], "gemma", bos_token="<bos>", eos_token="<eos>")
    system = {"role": "system", "content": SYSTEM}
    one, n = rendered(gemma, [system, {"role": "user", "content": "Say hi"}])
    two, m = rendered(
        gemma,
        [
            system,
            {"role": "user", "content": "Sum up"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Thanks"},
        ],
    )
    assert n == m == len(f"<start_of_turn>user\n{SYSTEM}\n\n")
    assert one[:n] == two[:n] and one[n:].startswith("Say hi") and two[n:].startswith("Sum up")
    llama3 = ChatTemplate(BUILTIN_TEMPLATES["llama3"], "llama3")
    prompt, n = rendered(llama3, [system, {"role": "user", "content": "Say hi"}])
    assert prompt[:n].endswith(f"{SYSTEM}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n")


def test_tools_rendered_first_are_part_of_it_and_tools_rendered_last_are_not() -> None:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x" * 200}} for i in range(8)]
    first = ChatTemplate(
        "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}",
        "model",
    )
    prompt, n = rendered(first, [{"role": "user", "content": "Say hi"}], tools)
    assert n == prompt.index("Say hi") and n > MIN_CHARS  # tools and no system: still a prefix
    last = ChatTemplate(TOOLS_AFTER, "model")  # tools after the conversation: only the system prompt is stable
    prompt, n = rendered(last, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}], tools)
    assert n == prompt.index("Hi") and "tool_0" not in prompt[:n]
    assert rendered(last, [{"role": "user", "content": "Hi"}], tools)[1] == 0


def test_a_short_or_missing_system_prompt_has_none() -> None:
    gemma = ChatTemplate(BUILTIN_TEMPLATES["gemma"], "gemma")
    assert rendered(gemma, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])[1] == 0
    assert rendered(gemma, [{"role": "user", "content": SYSTEM}])[1] == 0
