"""JavaScript clients against `/v1/responses`: the openai npm SDK, the Vercel AI SDK, and Codex CLI run unmodified.

They come from the npm registry with the machine's node/npm, pinned by tests/js/package-lock.json
and installed by `.ci/run` (`npm ci --prefix tests/js`) into tests/js/node_modules — never globally.
Codex CLI runs with its default tools (function tools, a `namespace` tool and the hosted
`web_search`) against a custom provider (`wire_api = "responses"`, `base_url` …/v1) and must
print the streamed answer of a generated model whose context holds Codex's ~40k-token first
request (the generated models' tokenizer is nearly byte-level).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gguf_factory import write_tiny_gguf
from support import TESTS, TINY_ID, LiveDaemon, start_daemon

from lmsp_tray.http.openai import responses as v1_responses
from lmsp_tray.protocol.events import Event
from lmsp_tray.protocol.openai_shapes import OpenAIView

JS = TESTS / "js"
MODULES = JS / "node_modules"
CODEX = MODULES / ".bin" / "codex"
CODEX_MODEL = "codex-tiny:1m-f32"


def _installed() -> None:
    if shutil.which("node") is None or not MODULES.is_dir():
        pytest.fail("the JavaScript clients are not installed: run `npm ci --prefix tests/js` (.ci/run does)")


def test_openai_npm_sdk_and_vercel_ai_sdk(daemon: LiveDaemon) -> None:
    _installed()
    env = {**os.environ, "LMSP_BASE": daemon.base + "/v1", "LMSP_TOKEN": daemon.owner_token, "LMSP_MODEL": TINY_ID}
    run = subprocess.run(
        ["node", "clients.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["sdk_sync"]["status"] == "incomplete" and seen["sdk_sync"]["text"] and seen["sdk_sync"]["store"]
    assert seen["sdk_stream"]["first"] == "response.created" and seen["sdk_stream"]["text"]
    assert seen["sdk_stream"]["last"] in ("response.completed", "response.incomplete")
    assert seen["sdk_stored"] == {"id": seen["sdk_sync"]["id"], "items": ["Say hi"]}
    # OpenAI's error object: the SDK shows the reason (it said "404 status code (no body)" for a problem document)
    error = seen["sdk_error"]
    assert (
        error["name"] == "NotFoundError" and error["code"] == "model_not_found" and "no-such-model" in error["message"]
    )
    assert seen["ai_generate"]["text"] and seen["ai_generate"]["finishReason"] == "length"
    assert seen["ai_stream"]["text"] and seen["ai_stream"]["finishReason"] == "length"


@pytest.fixture
def codex_daemon(tmp_path: Path, lmsp_home: Path) -> Any:
    folder = tmp_path / "codex-models"
    folder.mkdir()
    # 64k context for Codex's first request; a strong end-of-turn bias so the random model answers in a few
    # tokens and stops (Codex sends no max_output_tokens, and an incomplete response is an error to it).
    write_tiny_gguf(
        folder / "codex-tiny.gguf",
        basename="codex-tiny",
        context_length=65536,
        output_scale=0.5,
        # and never a call marker: Codex would run the call (the SDK tests cover calls)
        logit_bias={"<|im_end|>": 110.0, "<tool_call>": -200.0, "<think>": -200.0},
    )
    live = start_daemon(folder, context_cap=65536)
    yield live
    live.stop()


def test_codex_cli_default_configuration_streams_an_answer(
    codex_daemon: LiveDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed()
    bodies: list[dict[str, Any]] = []
    parse = v1_responses.parse_openai_response_create

    def recording(body: Any) -> Any:
        bodies.append(body)
        return parse(body)

    monkeypatch.setattr(v1_responses, "parse_openai_response_create", recording)
    terminal: list[dict[str, Any]] = []  # the terminal events the stream carried to Codex
    real_event = OpenAIView.event

    def watching(view: OpenAIView, event: Event) -> list[Event]:
        out = real_event(view, event)
        terminal.extend(e.data for e in out if e.terminal)
        return out

    monkeypatch.setattr(OpenAIView, "event", watching)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\n'
        'model_provider = "lmsp"\n'
        "check_for_update_on_startup = false\n"
        "[analytics]\nenabled = false\n"
        "[model_providers.lmsp]\n"
        'name = "lmsp-tray"\n'
        f'base_url = "{codex_daemon.base}/v1"\n'
        'env_key = "LMSP_TRAY_TOKEN"\n'
        'wire_api = "responses"\n'
    )
    env = {**os.environ, "CODEX_HOME": str(home), "LMSP_TRAY_TOKEN": codex_daemon.owner_token, "NO_COLOR": "1"}
    # Codex sends no temperature, so the random model samples: now and then its first token is the
    # (strongly favoured) end of turn and the answer is empty, which says nothing about Codex. Such a
    # run is tried again, up to eight times (three all ended at once beside a busy CPU); an answer that is not
    # empty must reach Codex's output.
    for _attempt in range(8):
        terminal.clear()
        run = subprocess.run(
            [str(CODEX), "exec", "--skip-git-repo-check", "Say hi"],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=170,
            check=False,
        )
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-4000:])
        assert [t["type"] for t in terminal] == ["response.completed"], terminal
        answer = "".join(
            part["text"]
            for item in terminal[0]["response"]["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
        if answer.strip():
            break
    assert answer.strip() and run.stdout.strip(), (answer, run.stderr[-4000:])  # Codex printed the streamed answer
    assert bodies, "Codex sent nothing to /v1/responses"
    first = bodies[0]
    assert first["stream"] is True and first["model"] == CODEX_MODEL
    kinds = [t.get("type") for t in first.get("tools", [])]
    assert "function" in kinds and "namespace" in kinds and "web_search" in kinds, kinds
