"""Chat templates come from downloaded files: rendered with a bound on work and time, off the event loop.

A template is a program. One that loops 40 million times is stopped past its
budget with a 400 naming the model (not seconds of a held thread per
request), templates cannot build huge strings or numbers with `*` and `**`,
and real families' templates stay far inside the budget even for very long
conversations. Over HTTP (a generated GGUF carrying the looping template) the
service answers health probes while it renders, and its other models serve on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from chat_templates import DEEPSEEK_R1, LLAMA31, MISTRAL, QWEN3
from gguf_factory import write_tiny_gguf
from support import TINY_ID, body

from lmsp_tray.engine.templates import ChatTemplate, RenderBudget
from lmsp_tray.errors import InvalidRequest

LOOPS_40M = "{% for i in range(10000) %}{% for j in range(4000) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"
EVIL_ID = "loopy-test:1m-f32"
CONVO = [{"role": "user", "content": "hi"}]


def test_a_template_that_loops_forty_million_times_is_stopped_naming_the_model() -> None:
    template = ChatTemplate(LOOPS_40M, "model", model_id="loopy:1b")
    with pytest.raises(InvalidRequest) as raised:
        template.render(CONVO)
    assert raised.value.param == "model"
    assert "'loopy:1b'" in raised.value.detail and "1,010,000 steps or 2 s" in raised.value.detail
    quick = ChatTemplate(LOOPS_40M, "model", budget=RenderBudget(base_steps=10_000))
    with pytest.raises(InvalidRequest):
        quick.render(CONVO)


def test_the_clock_stops_what_the_step_count_does_not() -> None:
    slow = ChatTemplate(LOOPS_40M, "model", model_id="m", budget=RenderBudget(base_steps=10**12, seconds=0.05))
    with pytest.raises(InvalidRequest) as raised:
        slow.render(CONVO)
    assert "0.05 s" in raised.value.detail


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 100000000 }}",
        "{{ [1] * 100000000 }}",
        "{{ 100000000 * 'ab' }}",
        "{{ 10 ** 100000000 }}",
        "{% set s = 'x' * 4000000 %}{{ (s * 2) | length }}",
    ],
)
def test_templates_cannot_build_huge_values(source: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        ChatTemplate(source, "model", model_id="m").render(CONVO)
    assert "budget" in raised.value.detail


def test_real_templates_render_long_conversations_well_inside_the_budget() -> None:
    convo = [{"role": "system", "content": "Be brief."}]
    for i in range(1000):
        convo.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20})
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(20)]
    tight = RenderBudget(base_steps=100_000, steps_per_message=1_000)  # a tenth of the default
    for source in (QWEN3, LLAMA31, MISTRAL, DEEPSEEK_R1):
        text = ChatTemplate(source, "model", budget=tight).render(convo, tools=tools)
        assert "turn 999" in text
    assert ChatTemplate("{{ 'ab' * 3 }}{{ 2 ** 10 }}", "model").render(CONVO) == "ababab1024"


@pytest.fixture
def model_files(tmp_path: Path, tiny_gguf: Path) -> list[Path]:
    loopy = write_tiny_gguf(tmp_path / "loopy.gguf", basename="loopy-test", chat_template=LOOPS_40M, seed=2)
    return [tiny_gguf, loopy]


def test_health_probes_answer_while_a_looping_template_renders(daemon_factory) -> None:
    live = daemon_factory()
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        c.post(f"/models/{EVIL_ID}/load").raise_for_status()
        answered: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(timeout=30) as p:
                while not stop.is_set():
                    if p.get(live.url).status_code == 200:
                        answered.append(time.monotonic())
                    time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            for _ in range(2):
                began = time.monotonic()
                r = c.post("/responses", json=body(model=EVIL_ID, max_output_tokens=2))
                ended = time.monotonic()
                assert r.status_code == 400, r.text
                doc = r.json()
                assert doc["code"] == "invalid_request" and doc["param"] == "model"
                assert f"'{EVIL_ID}'" in doc["detail"] and "budget" in doc["detail"]
                # The event loop went on answering while the template ran (on a worker thread).
                assert len([t for t in answered if began < t < ended]) >= 2
        finally:
            stop.set()
            prober.join(30)
        assert c.post("/responses", json=body(model=TINY_ID, max_output_tokens=2)).status_code == 200
        assert c.get(f"/models/{EVIL_ID}").json()["state"] == "loaded"  # the model itself is fine
