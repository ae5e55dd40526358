"""End to end on the real Gemma 3 270M file (no chat template in the file: the built-in gemma one)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support import events, start_daemon

GEMMA_ID = "gemma-3:270m-q4_k_m"
pytestmark = pytest.mark.gemma


@pytest.fixture
def gemma_daemon(tmp_path: Path, lmsp_home: Path, gemma_gguf: Path):
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / gemma_gguf.name).symlink_to(gemma_gguf)
    live = start_daemon(folder)
    yield live
    live.stop()


def test_gemma_sync_and_stream(gemma_daemon) -> None:
    with httpx.Client(base_url=gemma_daemon.url, timeout=120, headers=gemma_daemon.auth_headers) as c:
        listing = c.get("/models").json()["data"]
        [model] = [m for m in listing if m["id"] == GEMMA_ID]
        assert model["architecture"] == "gemma3" and model["parameters"] == "270M"
        assert model["quantization"] == "Q4_K_M"
        # Sized from memory (18 KiB of KV per token): 16k on a machine with a few GB to spare, up to the
        # trained 32k on a larger one, the old 8k only where 16k tokens of cache would not fit.
        assert model["context_length"] in {8192, 16384, 32768}
        question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        r = c.post("/responses", json={"model": GEMMA_ID, "input": question, "temperature": 0, "max_output_tokens": 40})
        assert r.status_code == 200, r.text
        doc = r.json()
        text = doc["output"][0]["content"][0]["text"]
        assert doc["status"] in {"completed", "incomplete"}
        assert text.strip()
        assert "<start_of_turn>" not in text and "<end_of_turn>" not in text
        assert 0 < doc["usage"]["output_tokens"] <= 40
        assert doc["usage"]["input_tokens"] > 10

        with c.stream(
            "POST",
            "/responses",
            json={"model": GEMMA_ID, "input": question, "temperature": 0, "max_output_tokens": 40, "stream": True},
        ) as s:
            evs = events(s)
        deltas = "".join(e.data["delta"] for e in evs if e.event == "response.output_text.delta")
        final = evs[-1].data["response"]
        assert evs[-1].event in {"response.completed", "response.incomplete"}
        assert deltas == final["output"][0]["content"][0]["text"] and deltas.strip()
        placement = c.get(f"/models/{GEMMA_ID}").json()["extensions"]["lmsp_tray"]
        assert placement["device"] == "cpu"
