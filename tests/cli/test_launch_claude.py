"""Claude Code, unmodified, through `lmsp-tray launch claude -- -p "…"` against a live service.

Claude Code comes from the npm registry (tests/js, installed by `.ci/run` with `npm ci`; its
binary arrives through a per-platform optional dependency). Its `-p` request carries its system
prompt and tools, ~4k tokens on a real vocabulary, so the model here is generated with Gemma's
vocabulary (read from the demo model's GGUF) and a 32k window; it ends its turn after a few tokens
(a bias on `<end_of_turn>`), since `claude -p` treats an answer cut at `max_tokens` as an error.

It gets an answer (exit 0); what it sent — tools, system blocks with its billing header, metadata,
thinking — was accepted as sent; and a second run in the same folder and HOME reads its fixed
prefix from the prompt cache (`cache_read_input_tokens` in the usage the service streamed to it),
which only works because the billing header's per-request hash is normalised.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf_factory import vocabulary_of, write_tiny_gguf
from keyring_support import secret_service  # noqa: F401 - the fixture
from launch_support import launch_env, run_launch
from support import LiveDaemon, start_daemon

from lmsp_tray.connect import forget
from lmsp_tray.http.anthropic import messages as anthropic_messages
from lmsp_tray.protocol.events import Event

pytestmark = pytest.mark.gemma

CLAUDE_BIN = Path(__file__).resolve().parent.parent / "js" / "node_modules" / ".bin"
MODEL = "claude-tiny:1m-f32"
# Gemma's turn markers; the system prompt goes into the first user turn, as Gemma's own template does.
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' }}"
    "{{ message['content'] or '' }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# Close to the best other logits, so top-k/min-p keep both: about one chance in four per token at the
# service's default sampling (Claude Code sends no temperature), so a few tokens, then the end of the turn.
END_OF_TURN_BIAS = 15.0


@pytest.fixture(scope="module")
def claude_daemon(
    tmp_path_factory: pytest.TempPathFactory, gemma_gguf: Path, secret_service: str
) -> Iterator[LiveDaemon]:
    if not (CLAUDE_BIN / "claude").exists():
        pytest.fail("Claude Code is not installed: run `npm ci --prefix tests/js` (.ci/run does)")
    folder = tmp_path_factory.mktemp("claude-models")
    write_tiny_gguf(
        folder / "claude-tiny.gguf",
        basename="claude-tiny",
        vocab=vocabulary_of(gemma_gguf),
        chat_template=TEMPLATE,
        context_length=32768,
        embedding=32,
        ffn=64,
        output_scale=0.1,
        logit_bias={"<end_of_turn>": END_OF_TURN_BIAS},
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(tmp_path_factory.mktemp("claude-home")))
        forget("Claude Code")
        live = start_daemon(folder, context_cap=32768)
        yield live
        live.stop()
        forget("Claude Code")


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What Claude Code sent to /v1/messages (the bodies, and any refusal), and the usage streamed back."""
    seen: dict[str, list[Any]] = {"bodies": [], "refused": [], "usage": []}
    parse, encode = anthropic_messages.parse_message_create, anthropic_messages.encode

    def recording_parse(body: Any) -> Any:
        seen["bodies"].append(body)

        try:
            return parse(body)
        except Exception as exc:
            seen["refused"].append(repr(exc))
            raise

    def recording_encode(event: Event) -> bytes:
        if event.data.get("type") == "message_delta":
            seen["usage"].append(event.data["usage"])
        return encode(event)

    monkeypatch.setattr(anthropic_messages, "parse_message_create", recording_parse)
    monkeypatch.setattr(anthropic_messages, "encode", recording_encode)
    return seen


def _claude(live: LiveDaemon, home: Path, work: Path, seen: dict[str, list[Any]]) -> Any:
    """One `launch claude -- -p`, tried again (up to three times) when the random model's answer is empty."""
    env = launch_env(HOME=str(home), PATH=f"{CLAUDE_BIN}{os.pathsep}{os.environ['PATH']}", NO_COLOR="1")
    for _attempt in range(3):
        for values in seen.values():
            values.clear()
        run, _ = run_launch(live, ["claude", "--", "-p", "Say hi"], env=env, cwd=work, timeout=240)
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-4000:], seen["refused"])
        if run.stdout.strip():
            break
    return run


@pytest.mark.timeout(900)
def test_claude_code_answers_and_its_second_run_reads_the_cache(
    claude_daemon: LiveDaemon, tmp_path: Path, seen: dict[str, list[Any]]
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    first = _claude(claude_daemon, home, work, seen)
    assert first.stdout.strip(), (first.stderr[-4000:], seen["usage"])  # Claude Code printed the model's answer
    assert seen["bodies"] and seen["refused"] == [], seen["refused"]
    main = [b for b in seen["bodies"] if b.get("tools")]
    assert main, [sorted(b) for b in seen["bodies"]]
    body = main[0]
    assert body["model"] == MODEL and body["stream"] is True
    assert isinstance(body["system"], list) and "x-anthropic-billing-header" in body["system"][0]["text"]
    assert all("input_schema" in tool for tool in body["tools"] if "name" in tool)
    assert "metadata" in body, sorted(body)
    prompt = sum(seen["usage"][-1].get(k) or 0 for k in ("input_tokens", "cache_read_input_tokens"))
    assert prompt > 2000, seen["usage"]  # its system prompt and tools, on Gemma's vocabulary

    second = _claude(claude_daemon, home, work, seen)
    assert second.stdout.strip()
    cached = max((u.get("cache_read_input_tokens") or 0) for u in seen["usage"])
    # Its fixed prefix, the system prompt and tools (18,209 of ~19,700 tokens with Claude Code 2.1.197),
    # comes from the cache; the turns after it may differ from one run to the next.
    assert cached >= 0.85 * prompt, (cached, prompt, seen["usage"])
    print(f"Claude Code's prompt: {prompt} tokens; its second run read {cached} from the cache")
