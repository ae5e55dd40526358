"""A model's `draft = "<id>"` setting: the service finds the draft among its models, the model process
drafts with it (greedy output unchanged, its counters in /metrics, its id in the listing), and a draft
that is missing or of another vocabulary is refused with the reason while the model still serves.

The generated models share one vocabulary, so the tiny model can draft for the bigger slow one."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import SLOW_ID, TINY_ID, LiveDaemon

pytestmark = pytest.mark.timeout(300)
OTHER_ID = "other-vocab:1m-f32"
PROMPTS = ["Tell me a story about the sea", "hello world", "the local model"]


@pytest.fixture(scope="module")
def other_vocab_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf_factory import write_tiny_gguf

    return write_tiny_gguf(
        tmp_path_factory.mktemp("models") / "other-vocab.gguf", basename="other-vocab", user_defined=["<extra>"]
    )


@pytest.fixture
def model_files(tiny_gguf: Path, slow_gguf: Path, other_vocab_gguf: Path) -> list[Path]:
    return [tiny_gguf, slow_gguf, other_vocab_gguf]


def _greedy(client: httpx.Client, prompt: str) -> str:
    r = client.post("/responses", json={"model": SLOW_ID, "input": prompt, "temperature": 0, "max_output_tokens": 48})
    assert r.status_code == 200, r.text
    return "".join(c["text"] for item in r.json()["output"] for c in item.get("content", []) if "text" in c)


def _reload(client: httpx.Client, draft: str | None) -> dict:
    changed = client.patch(f"/models/{SLOW_ID}/settings", json={"draft": draft})
    assert changed.status_code == 200, changed.text
    client.post(f"/models/{SLOW_ID}/unload")
    loaded = client.post(f"/models/{SLOW_ID}/load")
    assert loaded.status_code == 200, loaded.text
    return loaded.json()["extensions"]["lmsp_tray"]


def _metric(live: LiveDaemon, name: str) -> float:
    text = httpx.get(live.base + "/metrics", headers=live.auth_headers, timeout=60).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels.get("model") == SLOW_ID:
                return s.value
    return 0.0


def test_a_draft_model_drafts_and_the_output_is_unchanged(daemon_factory) -> None:
    live: LiveDaemon = daemon_factory()
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=120) as client:
        bare = _reload(client, None)
        assert "draft_model" not in bare and "draft_skipped" not in bare
        expected = [_greedy(client, p) for p in PROMPTS]
        ext = _reload(client, TINY_ID)
        assert ext["draft_model"] == TINY_ID and "draft_skipped" not in ext
        assert client.get(f"/models/{SLOW_ID}").json()["extensions"]["lmsp_tray"]["settings"]["applies"]["draft"] == (
            "next_load"
        )
        assert [_greedy(client, p) for p in PROMPTS] == expected
        drafted = _metric(live, "lmsp_draft_model_tokens_total")
        assert drafted > 0, "the draft model never drafted"
        assert _metric(live, "lmsp_draft_tokens_total") >= drafted
        assert _metric(live, "lmsp_draft_model_tokens_accepted_total") <= drafted


@pytest.mark.parametrize(
    ("draft", "says"),
    [
        (OTHER_ID, "another vocabulary"),
        ("no-such-model", "was not found"),
        (SLOW_ID, "is the model itself"),
    ],
)
def test_an_unusable_draft_is_refused_and_the_model_still_serves(daemon_factory, draft: str, says: str) -> None:
    live: LiveDaemon = daemon_factory()
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=120) as client:
        ext = _reload(client, draft)
        assert "draft_model" not in ext
        assert f"'{draft}'" in ext["draft_skipped"] and says in ext["draft_skipped"], ext["draft_skipped"]
        assert _greedy(client, PROMPTS[0])
        assert _metric(live, "lmsp_draft_model_tokens_total") == 0
