"""The engine under grammars, with real llama.cpp: lazy switch-on, dead ends, visible control tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from generation import generate

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.jobs import ERROR, STOP, GrammarOn
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner.model import LlamaModel, LoadOptions
from lmsp_tray.runner.runtime import Runtime


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Iterator[LlamaModel]:
    path = tiny_gguf
    entry = ModelEntry(
        "tiny",
        Path(path),
        "custom",
        path.stat().st_size,
        (path,),
        GGUFInfo(architecture="llama", context_length=512, block_count=2),
    )
    runtime = Runtime()
    loaded = LlamaModel(runtime, entry, LoadOptions(parallel=2, threads=1))
    yield loaded
    loaded.close()


def hello(model: LlamaModel) -> list[int]:
    """The prompt every job here starts from."""
    return model.tokenize("hello")


class AtThirdToken:
    """A lazy grammar whose trigger fires at the third token, switching on rule `tail`."""

    roots = ("tail",)

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def start(self):
        def trigger(piece: bytes) -> str | None:
            self.seen.append(piece)
            return "tail" if len(self.seen) == 3 else None

        return trigger


def test_lazy_grammar_switches_on_when_the_trigger_says(model: LlamaModel) -> None:
    lazy = AtThirdToken()
    grammar = 'root ::= "never"\ntail ::= "[done]"'
    run = generate(model, hello(model), 40, SamplingParams(seed=1, grammar=grammar), grammar_trigger=lazy)
    text, finish, items = run.text, run.finish, run.items
    assert finish.reason == STOP and text.endswith("[done]")  # free for three tokens, then the rule
    assert finish.output_tokens >= 4 and len(lazy.seen) == 3
    # The switch is told in order, before the text decoded under the grammar (the parser reads it so).
    on = items.index(GrammarOn("tail"))
    before = [i for i in items[:on] if isinstance(i, str)]
    after = "".join(i for i in items[on:] if isinstance(i, str))
    assert len(before) <= 2 and after.endswith("[done]")  # the third token's text comes after the switch


def test_a_grammar_with_no_way_on_fails_the_request_not_the_engine(model: LlamaModel) -> None:
    text, finish = generate(model, hello(model), 40, SamplingParams(seed=1, grammar=r'root ::= "a" [\x00]'))
    assert finish.reason == ERROR and finish.error is not None and "cannot be continued" in finish.error.detail
    text, finish = generate(model, hello(model), 40, SamplingParams(seed=2, grammar='root ::= "ok"'))
    assert (text, finish.reason) == ("ok", STOP)  # the scheduler still serves


def test_visible_control_tokens_reach_the_text(model: LlamaModel) -> None:
    tag = model.find_token("<|python_tag|>")
    assert tag is not None and model.is_control(tag)
    grammar = 'root ::= "<|python_tag|>" "x"'
    hidden, _ = generate(model, hello(model), 40, SamplingParams(seed=1, grammar=grammar, temperature=0))
    shown, _ = generate(
        model, hello(model), 40, SamplingParams(seed=1, grammar=grammar, temperature=0), visible_tokens=frozenset({tag})
    )
    assert shown == "<|python_tag|>x"
    assert hidden in ("x", "<|python_tag|>x")  # spelt with byte tokens it is text either way
