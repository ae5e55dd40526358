"""Helpers for tests: start a real daemon in-process on a free loopback port, read SSE, wait for things.

Light to import (the daemon is imported when one is started): subprocess helpers use `wait_until` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

if TYPE_CHECKING:
    from lmsp_tray.daemon import Daemon

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent  # the tests folder: support modules, scripts run as children
ROOT = TESTS.parent  # the checkout

TINY_ID = "tiny-test:1m-f32"
SLOW_ID = "slow-test:4m-f32"


class MemoryVault:
    """Stands in for the OS keyring in tests that are not about it (tests/auth/test_keyring.py uses the real one)."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def check(self) -> None:
        pass

    def store(self, token_id: str, secret: str, label: str | None = None) -> None:
        self.entries[token_id] = secret

    def load(self, token_id: str) -> str | None:
        return self.entries.get(token_id)

    def delete(self, token_id: str) -> bool:
        return self.entries.pop(token_id, None) is not None


@dataclass
class LiveDaemon:
    daemon: Daemon
    url: str

    @property
    def service(self):
        return self.daemon.service

    @property
    def owner_token(self) -> str:
        secret = self.daemon.auth.tokens.owner_secret
        assert secret
        return secret

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.owner_token}"}

    @property
    def base(self) -> str:
        """http://127.0.0.1:PORT (without /lmsp/v1)."""
        return self.url.removesuffix("/lmsp/v1")

    def scheduler(self, model_id: str = TINY_ID):
        model = self.daemon.models.get(model_id)
        assert model is not None and model.scheduler is not None, f"{model_id} is not loaded"
        return model.scheduler

    def stop(self) -> None:
        self.daemon.stop_background()


def start_daemon(
    models_dir: Path,
    *,
    home: Path | None = None,
    vault: Any = None,
    token_repository: Any = None,
    devices: Any = None,
    **overrides: Any,
) -> LiveDaemon:
    """A daemon on a free port, its data under `home` (else where LMSP_TRAY_HOME says); `devices`: what
    it plans for instead of what the device probe finds (a `Devices`)."""
    from lmsp_tray.config import HOME_ENV, Config, resolve_paths
    from lmsp_tray.daemon import Daemon, build_catalog  # here: the helpers above stay light for subprocesses

    paths = resolve_paths({HOME_ENV: str(home)} if home else None).ensure()
    config = Config(models_dirs=[models_dir], default_dirs=False, demo_model=False).with_overrides(**overrides)
    daemon = Daemon(
        paths,
        config,
        catalog=build_catalog(paths, config),
        vault=vault or MemoryVault(),
        token_repository=token_repository,
        devices=devices,
    )
    daemon.start_background(daemon.bind(0))
    assert daemon.url
    return LiveDaemon(daemon, daemon.url)


def link_models(folder: Path, files: list[Path], *, copy: bool = False) -> Path:
    """A models folder of links to `files` (read in place, like a user's models folder), or of
    copies of them (that a test may damage, and whose changes the folder watcher sees)."""
    folder.mkdir(exist_ok=True)
    for model in files:
        if copy:
            shutil.copyfile(model, folder / model.name)
        else:
            (folder / model.name).symlink_to(model)
    return folder


def cli_token(argv: list[str], env: dict[str, str], *scopes: str, cwd: Any = None) -> str:
    """A token made by `<argv> tokens create` before the service starts (the CLI then acts on the data folder).

    Only the secret is on stdout; without a keyring it warns on stderr and still prints it.
    """
    import subprocess

    args = [*argv, "tokens", "create", "--name", "test"]
    for scope in scopes or ("models:read", "models:manage", "responses:create"):
        args += ["--scope", scope]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr
    secret = out.stdout.strip()
    assert secret.startswith("lmsp_") and "\n" not in secret, out.stdout
    return secret


@dataclass
class SSE:
    id: int | None
    event: str
    data: dict[str, Any]


def iter_sse(response: httpx.Response) -> Iterator[SSE | str]:
    """Parse an SSE byte stream; comment lines come out as plain strings."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield line
            continue
        if not line:
            if fields:
                yield SSE(
                    int(fields["id"]) if "id" in fields else None,
                    fields.get("event", "message"),
                    json.loads(fields.get("data", "null")),
                )
                fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


def stream_deltas(live: LiveDaemon, payload: dict[str, Any], timeout: float = 300) -> Iterator[SSE]:
    """Stream `POST /responses` on its own connection and yield each text delta as it arrives;
    leaving the loop closes the connection (the client disconnects)."""
    with (
        httpx.Client(base_url=live.url, timeout=timeout, headers=live.auth_headers) as c,
        c.stream("POST", "/responses", json=payload) as r,
    ):
        for e in iter_sse(r):
            if isinstance(e, SSE) and e.event == "response.output_text.delta":
                yield e


def events(response: httpx.Response) -> list[SSE]:
    return [e for e in iter_sse(response) if isinstance(e, SSE)]


def body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": TINY_ID, "input": text, "temperature": 0, **extra}  # extra may override model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    what: str | Callable[[], str] = "the condition",
    *,
    interval: float = 0.02,
    ignoring: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `condition` until it returns something truthy, and return that.

    The one way tests wait for something to happen. After `timeout` seconds the
    test fails with an AssertionError naming `what` (a callable describes the
    state reached instead); exceptions of the `ignoring` types count as "not yet"
    (the last one is chained to the failure).
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except ignoring as exc:
            last = exc
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {described}") from last
        time.sleep(interval)


async def until(condition: Callable[[], T], timeout: float = 30.0, what: str = "the condition") -> T:
    """`wait_until` for code on an event loop (the condition is checked between the loop's other work)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.001)
    return value


def json_lines(path: Path) -> list[Any]:
    """The JSON lines another process has written whole to `path` so far ([] before the file exists).

    The one way tests read a record file that a helper process appends to while they poll it: a line
    not yet ended by its newline is still being written and is not read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def wait_task(c: httpx.Client, task_id: str, statuses: set[str], timeout: float = 120) -> dict:
    """Poll `GET /tasks/{id}` until the task reaches one of `statuses`; return its document."""
    last: dict = {}

    def reached() -> dict | None:
        last.update(c.get(f"/tasks/{task_id}").json())
        return dict(last) if last["status"] in statuses else None

    return wait_until(reached, timeout, lambda: f"{task_id} to reach {statuses} (last: {last})", interval=0.05)


def isolated_env(tmp_path: Path, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a command run as a user of its own: this process's environment without a
    display (so no tray), with HOME, caches, Hugging Face, Ollama and lmsp-tray's home under `tmp_path`."""
    home = tmp_path / "user"
    home.mkdir(exist_ok=True)
    gone = {"DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", *drop}
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env.update(
        {
            "LMSP_TRAY_HOME": str(tmp_path / "lmsp"),
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "HF_HOME": str(home / "hf"),
            "OLLAMA_MODELS": str(home / "ollama"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def wait_url(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until `url` answers 200, failing at once (with its stderr) if `proc` exits meanwhile."""

    def answered() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
        return httpx.get(url, timeout=1).status_code == 200

    wait_until(answered, timeout, f"{url} to answer", interval=0.1, ignoring=httpx.HTTPError)


def cli_headers(env: dict[str, str], *scopes: str) -> dict[str, str]:
    """Bearer headers for a token made by `lmsp-tray tokens create` in `env` (the owner's own CLI)."""
    return {"Authorization": f"Bearer {cli_token([sys.executable, '-m', 'lmsp_tray'], env, *scopes)}"}


STREAM_PROMPTS = ["hello world", "the local model", "a test of the stream", "weather in the city"]


def assert_streams_decode_together(live: LiveDaemon, run: Callable[[str], str]) -> None:
    """Batching holds on a door: `run` streams one prompt on SLOW_ID; the four prompts streamed at once give
    each the text it gets alone, in far fewer decode steps than the four runs one after another took.

    On the slower generated model: the tiny one decodes 40 tokens in about 50 ms, less than the four
    requests can take to arrive on a busy machine, so they would barely overlap."""
    import concurrent.futures as cf
    import threading

    alone = {p: run(p) for p in STREAM_PROMPTS}
    solo_steps = live.scheduler(SLOW_ID).steps
    barrier = threading.Barrier(len(STREAM_PROMPTS))

    def together(p: str) -> str:
        barrier.wait()
        return run(p)

    with cf.ThreadPoolExecutor(len(STREAM_PROMPTS)) as pool:
        batched = dict(zip(STREAM_PROMPTS, pool.map(together, STREAM_PROMPTS)))
    assert batched == alone
    assert live.scheduler(SLOW_ID).steps - solo_steps < solo_steps * 0.75


def llama_server_binary() -> Path:
    """llama.cpp's own llama-server, built from the sources vendored in the installed llama-cpp-python
    (benchmarks/build_llama_server.sh): the reference the correctness tests compare with (rerank scores,
    tokenizing, images). `LMSP_LLAMA_SERVER`, else the bench cache's build. Where it is not built the test
    skips, unless `LMSP_REQUIRE_LLAMA_SERVER=1` (as `.ci/run` sets, after building it): then it fails."""
    import importlib.metadata

    import pytest

    given = os.environ.get("LMSP_LLAMA_SERVER")
    if given and Path(given).is_file():
        return Path(given)
    version = importlib.metadata.version("llama_cpp_python")  # not `import llama_cpp`: no libllama here
    path = Path(os.environ.get("LMSP_BENCH_CACHE", ROOT / ".bench-cache")) / f"llama-server-{version}/bin/llama-server"
    if path.is_file():
        return path
    why = f"llama-server is not built ({path}); benchmarks/build_llama_server.sh builds it, as .ci/run does"
    if os.environ.get("LMSP_REQUIRE_LLAMA_SERVER") == "1":
        pytest.fail(why)
    pytest.skip(why)


@contextlib.contextmanager
def llama_server(model: Path, *args: str) -> Iterator[str]:
    """llama-server on `model` (with `args`; `--no-repack` as the service keeps weights on AMX CPUs), one
    thread, on a free port: its base URL once it answers /health; stopped afterwards."""
    port = free_port()
    argv = [str(llama_server_binary()), "-m", str(model), "--no-repack", "--port", str(port), "-t", "1", *args]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: httpx.get(base + "/health", timeout=1).status_code == 200,
                120,
                "llama-server to load",
                ignoring=httpx.HTTPError,
            )
            yield base
        finally:
            proc.terminate()
            proc.wait(30)
