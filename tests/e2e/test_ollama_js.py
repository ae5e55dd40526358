"""Ollama's official JavaScript client (npm `ollama`) against the service's Ollama-compatible API.

It comes from the npm registry with the machine's node/npm, pinned by tests/js/package-lock.json
and installed by `.ci/run` (`npm ci --prefix tests/js`) into tests/js/node_modules, beside the
other JavaScript clients. `tests/js/ollama.mjs` lists the models, chats (whole and streamed),
generates, embeds and meets an error, on the service's own port with a bearer token (the Python
client's tests in tests/http/test_ollama_client.py cover the rest, the second listener included).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf_factory import write_tiny_bert_gguf
from support import TESTS, TINY_ID, LiveDaemon, start_daemon

JS = TESTS / "js"
EMBED_ID = "tiny-embed:1m-f32"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[LiveDaemon]:
    folder = tmp_path_factory.mktemp("ollama-js-models")
    (folder / tiny_gguf.name).symlink_to(tiny_gguf)
    write_tiny_bert_gguf(folder / "tiny-embed-1m-f32.gguf")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # the second listener's: not 11434, which a real Ollama may hold
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSP_TRAY_HOME", str(tmp_path_factory.mktemp("home")))
        daemon = start_daemon(folder, threads=1, ollama_port=port)
        try:
            yield daemon
        finally:
            daemon.stop()


@pytest.mark.parametrize("door", ["service port", "ollama_port"])
def test_ollama_npm_client_lists_chats_generates_embeds_and_sees_errors(live: LiveDaemon, door: str) -> None:
    if shutil.which("node") is None or not (JS / "node_modules" / "ollama").is_dir():
        pytest.fail("the JavaScript clients are not installed: run `npm ci --prefix tests/js` (.ci/run does)")
    host = live.base if door == "service port" else live.daemon.ollama_url
    assert host and live.daemon.ollama_url != live.base  # the second listener is up, on its own port
    env = {
        **os.environ,
        "OLLAMA_HOST": host,
        "LMSP_TOKEN": live.owner_token,
        "LMSP_MODEL": TINY_ID,
        "LMSP_EMBED_MODEL": EMBED_ID,
    }
    run = subprocess.run(
        ["node", "ollama.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    names = {m["model"] for m in seen["list"]}
    assert {TINY_ID, EMBED_ID} <= names and all(m["name"] == m["model"] and m["format"] == "gguf" for m in seen["list"])
    chat = seen["chat"]
    assert chat["role"] == "assistant" and chat["content"] and chat["done"] and chat["done_reason"] == "length"
    assert chat["eval_count"] == 8
    stream = seen["chat_stream"]  # greedy: the streamed pieces add up to the whole answer
    assert stream["content"] == chat["content"] and stream["parts"] > 1 and stream["done"]
    assert stream["done_reason"] == "length" and stream["eval_count"] == 8
    assert seen["generate"]["response"] and seen["generate"]["done"] and seen["generate"]["eval_count"] == 8
    assert seen["embed"]["count"] == 2 and len(set(seen["embed"]["dims"])) == 1 and seen["embed"]["dims"][0] > 0
    error = seen["error"]  # Ollama's error shape: the client raises ResponseError with the status and the text
    assert error["name"] == "ResponseError" and error["status"] == 404 and "no-such-model" in error["message"]
    keyless = seen["keyless"]  # no key sent: the refusal says which setting lets such apps in
    assert keyless["status"] == 401 and "keyless_scopes" in keyless["message"], keyless
