"""A new conversation after a restart goes on from the last one's system prompt (Gemma's sliding window).

Claude Code's next session shares with the last one only its system prompt and tools. On Gemma 3,
whose sliding-window layers keep only their last 512 positions, a saved state can go on only from
its end or from a window checkpoint saved with it; the service checkpoints where the rendered
system prompt ends (`chat.prefix`), so after a restart the next session's request reads that prefix
from the prompt cache (`cache_read_input_tokens`) instead of evaluating all of it again. Before that
checkpoint existed it read nothing (benchmarks/README.md: 0 of 19,602 tokens).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support import start_daemon

GEMMA_ID = "gemma-3:270m-q4_k_m"
pytestmark = pytest.mark.gemma

TOPICS = ["lighthouse", "harbour", "weather", "ships", "lamp", "reef", "letters", "gulls", "tide", "storm"]


def text(seed: int, sentences: int) -> str:
    return " ".join(
        f"Rule {seed}.{i}: mind the {TOPICS[(seed + i) % 10]} at {i % 24} o'clock." for i in range(sentences)
    )


def ask(live, body: dict) -> dict:
    with httpx.Client(base_url=live.base, timeout=600, headers=live.auth_headers) as c:
        r = c.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
        return r.json()


def test_the_next_session_after_a_restart_reads_the_system_prompt_from_the_cache(
    tmp_path: Path, gemma_gguf: Path
) -> None:
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / gemma_gguf.name).symlink_to(gemma_gguf)
    home = tmp_path / "home"
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.123; cch=0a1b2;"},
        {"type": "text", "text": text(1, 70), "cache_control": {"type": "ephemeral"}},
    ]

    def session(question: str, stamp: str) -> dict:
        blocks = [{**system[0], "text": f"x-anthropic-billing-header: cc_version=2.1.197.{stamp}; cch={stamp};"}]
        user = [{"type": "text", "text": question}, {"type": "text", "text": text(7, 45)}]  # ~800 tokens after
        return {
            "model": GEMMA_ID,
            "system": [*blocks, system[1]],
            "messages": [{"role": "user", "content": user}],
            "max_tokens": 4,
            "temperature": 0,
        }

    live = start_daemon(folder, home=home, context_cap=4096, parallel=1)
    try:
        first = ask(live, session("Which rule comes first?", "e51"))
        assert not first["usage"].get("cache_read_input_tokens")
        with httpx.Client(base_url=live.base, timeout=600, headers=live.auth_headers) as c:
            probe = {"model": GEMMA_ID, "system": session("", "e51")["system"]}
            probe["messages"] = [{"role": "user", "content": "\x01"}]
            counted = c.post("/v1/messages/count_tokens", json=probe, headers={"anthropic-version": "2023-06-01"})
            assert counted.status_code == 200, counted.text
            prefix = counted.json()["input_tokens"] - 8  # the system prompt: less the probe's turn
    finally:
        live.stop()  # the model closes and saves its sequence, with the system prompt's checkpoint
    assert prefix > 1000
    live = start_daemon(folder, home=home, context_cap=4096, parallel=1)
    try:
        second = ask(live, session("Which rule comes last?", "9ab"))  # a new session: new stamp, new question
    finally:
        live.stop()
    usage = second["usage"]
    assert usage["cache_read_input_tokens"] >= prefix, usage
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > prefix + 700
