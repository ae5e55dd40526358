"""Generated GGUF repositories on the local fake Hub (`hub_server.FakeHub`), and fixtures for download tests.

Every served model is a real GGUF written by `gguf_factory` (llama.cpp loads
it), each variant a different size. Repositories:

- ``test-org/Tiny-GGUF``: ``Tiny-Q4_K_M.gguf``, ``Tiny-Q5_K_M.gguf``, a Q8_0
  split into three parts under ``Q8_0/``, ``mmproj-F16.gguf`` and
  ``mmproj-F32.gguf`` (a vision model's projectors), and a small ``README.md``;
- ``test-org/NoQ4-GGUF``: Q5_K_M, Q8_0 and F16 but no Q4_K_M;
- ``test-org/Gated-GGUF``: one Q4_K_M file behind a licence (token `GRANTED`
  has access, `NOT_GRANTED` does not).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from hub_server import FakeHub
from support import SSE, LiveDaemon, iter_sse

TINY = "test-org/Tiny-GGUF"
NOQ4 = "test-org/NoQ4-GGUF"
GATED = "test-org/Gated-GGUF"
GRANTED = "hf_granted_test_token_0123456789"
NOT_GRANTED = "hf_other_test_token_9876543210"
FILE_TYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q8_0": 7, "F16": 1, "F32": 0}


def gguf_bytes(folder: Path, name: str, quant: str, *, embedding: int = 64, split: int = 0) -> list[bytes]:
    """A tiny model's file(s) labelled `quant` (split into parts when `split` > 0)."""
    first = write_tiny_gguf(
        folder / f"{name}.gguf",
        basename="tiny-hub",
        size_label="1M",
        file_type=FILE_TYPES[quant],
        embedding=embedding,
        seed=embedding,
        split_max_tensors=split,
    )
    if not split:
        return [first.read_bytes()]
    parts = sorted(folder.glob(f"{name}-*-of-*.gguf"))
    return [p.read_bytes() for p in parts]


def build_repos(hub: FakeHub, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    q8_parts = gguf_bytes(folder / "q8", "Tiny-Q8_0", "Q8_0", embedding=128, split=8)
    assert len(q8_parts) == 3, len(q8_parts)
    tiny = {
        "Tiny-Q4_K_M.gguf": gguf_bytes(folder, "Tiny-Q4_K_M", "Q4_K_M", embedding=64)[0],
        "Tiny-Q5_K_M.gguf": gguf_bytes(folder, "Tiny-Q5_K_M", "Q5_K_M", embedding=96)[0],
        **{f"Q8_0/Tiny-Q8_0-{i:05d}-of-00003.gguf": data for i, data in enumerate(q8_parts, 1)},
        "mmproj-F16.gguf": gguf_bytes(folder, "mmproj-F16", "F16", embedding=32)[0],
        "mmproj-F32.gguf": gguf_bytes(folder, "mmproj-F32", "F32", embedding=48)[0],
        "README.md": b"---\nlicense: mit\n---\n# Tiny GGUF\n",
    }
    hub.add_repo(TINY, tiny, small={"README.md"}, downloads=1200, likes=34, last_modified="2026-03-02T08:00:00.000Z")
    hub.add_repo(
        NOQ4,
        {
            "NoQ4-Q5_K_M.gguf": gguf_bytes(folder, "NoQ4-Q5_K_M", "Q5_K_M", embedding=80)[0],
            "NoQ4-Q8_0.gguf": gguf_bytes(folder, "NoQ4-Q8_0", "Q8_0", embedding=112)[0],
            "NoQ4-F16.gguf": gguf_bytes(folder, "NoQ4-F16", "F16", embedding=144)[0],
        },
        downloads=56,
        likes=2,
    )
    hub.add_repo(
        GATED,
        {"Gated-Q4_K_M.gguf": gguf_bytes(folder, "Gated-Q4_K_M", "Q4_K_M", embedding=72)[0]},
        gated=True,
        granted={GRANTED},
    )


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    with FakeHub() as hub:
        build_repos(hub, tmp_path_factory.mktemp("hub-repos"))
        yield hub


@pytest.fixture
def hub(fake_hub: FakeHub) -> Iterator[FakeHub]:
    """The module's fake Hub with its counters and faults reset for this test."""
    fake_hub.served.clear()
    fake_hub.downloaded.clear()
    fake_hub.cdn_auth.clear()
    fake_hub.hub_auth.clear()
    fake_hub.log.clear()
    fake_hub.searches.clear()
    fake_hub.cut_at.clear()
    fake_hub.flip.clear()
    for pause in fake_hub.pause_at.values():
        pause.release.set()
    fake_hub.pause_at.clear()
    fake_hub.ignore_range.clear()
    yield fake_hub
    for pause in fake_hub.pause_at.values():
        pause.release.set()


@pytest.fixture
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: FakeHub) -> Path:
    """HF_ENDPOINT at the fake Hub, an empty HF cache and no token; returns the cache folder."""
    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf_env: Path) -> Path:
    """A user home with nothing in it but what the test pulls (default folders are scanned)."""
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.setenv("OLLAMA_MODELS", str(user / "ollama"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("LLAMA_CACHE", raising=False)
    return user


@pytest.fixture
def hub_daemon(daemon_factory, home: Path) -> LiveDaemon:
    """A daemon of each test's own (downloads change its catalog and cache), scanning the default folders."""
    hub_daemon = daemon_factory(default_dirs=True)
    hub_daemon.daemon.downloads.progress_every = 0.0  # every progress step becomes an event (they are few here)
    return hub_daemon


@pytest.fixture
def c(hub_daemon: LiveDaemon):
    with httpx.Client(base_url=hub_daemon.url, timeout=60, headers=hub_daemon.auth_headers) as client:
        yield client


def wait_for_progress(c: httpx.Client, task_id: str, at_least: int) -> None:
    for e in iter_stream(c, task_id):
        if e.event == "model.download.progress" and e.data["bytes_done"] >= at_least:
            return
    raise AssertionError("no progress")


def iter_stream(c: httpx.Client, task_id: str):
    with c.stream("GET", f"/tasks/{task_id}/events") as r:
        for e in iter_sse(r):
            if isinstance(e, SSE):
                yield e
