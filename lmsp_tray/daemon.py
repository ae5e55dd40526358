"""The composition root: builds every part, serves the API, and shuts down cleanly.

Nothing else in the package constructs long-lived objects. `Daemon` builds
the llama.cpp runtime, the catalog, the model manager and the service from
`Paths` and `Config`, opens the store (token metadata; its housekeeper
writes token last-used times), makes sure an owner token exists (`auth`:
tokens and pairings, also used by the tray), runs uvicorn on loopback (in the foreground for
`serve`, or on a background thread under the tray), writes the discovery
file once the socket is bound and removes it on exit. SIGTERM/SIGINT or
Quit: stop accepting, end open streams with a terminal event, unload models.

The store: one SQLite database in the data folder (`Paths.database`). It is
opened and recovered (tasks a crash interrupted end `service_restarted`)
before the socket serves anything; queued tasks start with the server; the
housekeeper purges expired events, keys and (if configured) old responses
in the background; on exit running tasks end with a terminal event
(`tasks` module docstring), then the database is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from lmsp_tray import __version__
from lmsp_tray.auth.pairing import Auth, PairingBroker
from lmsp_tray.auth.tokens import StoreTokenRepository, TokenManager, TokenRepository
from lmsp_tray.auth.vault import SecretVault
from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.catalog import Catalog
from lmsp_tray.discovery.watch import FolderWatcher
from lmsp_tray.engine.load_plan import MAX_DEFAULT_PARALLEL, LoadOptions
from lmsp_tray.engine.manager import MemoryBudget, ModelManager
from lmsp_tray.engine.runtime import Runtime
from lmsp_tray.http.app import create_app
from lmsp_tray.http.security import MAX_HEADER_BYTES
from lmsp_tray.instance import remove_discovery_file, write_discovery_file
from lmsp_tray.serving.conversations import Conversations
from lmsp_tray.serving.recovery import recover
from lmsp_tray.serving.replay import Idempotency
from lmsp_tray.serving.responder import Responder
from lmsp_tray.serving.service import Capabilities, Service
from lmsp_tray.serving.tasks import TaskManager
from lmsp_tray.store import Database, Housekeeper, LastUsedBatcher
from lmsp_tray.store.idempotency_keys import IDEMPOTENCY_TTL_S

log = logging.getLogger("lmsp_tray.daemon")

EXIT_DEADLINE_S = 20.0  # after SIGTERM/SIGINT, the longest a clean stop may take before the process just exits


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon ends streams first, then stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


def build_catalog(paths: Paths, config: Config) -> Catalog:
    """The model catalog over every folder family the configuration asks for."""
    return Catalog.from_config(paths, config)


def load_options(config: Config, runtime: Runtime) -> LoadOptions:
    return LoadOptions(
        context_cap=config.context_cap,
        parallel=config.parallel,
        threads=config.threads,
        gpu=config.gpu,
        gpu_layers=config.gpu_layers,
        max_queue=config.max_queue,
        kv_budget_bytes=_kv_budget(config),
    )


def _total_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _kv_budget(config: Config) -> int | None:
    """A quarter of the memory budget may go to the KV caches of parallel sequences."""
    total = _total_ram()
    return None if total is None else int(total * config.memory_budget_fraction / 4)


def memory_budget(config: Config, runtime: Runtime) -> MemoryBudget:
    """At most `max_loaded_models`, within a share of RAM (and of VRAM when a GPU is used)."""
    total = _total_ram()
    vram = sum(d.total_bytes for d in runtime.devices)
    return MemoryBudget(
        max_models=config.max_loaded_models,
        ram_bytes=None if total is None else int(total * config.memory_budget_fraction),
        vram_bytes=int(vram * config.memory_budget_fraction) if vram and config.gpu != "off" else None,
    )


@dataclass(frozen=True)
class StoreSettings:
    """How long the store keeps things (seconds; None: until deleted)."""

    event_retention_s: float = 86400.0  # a finished task's events (then 410 event_history_expired)
    idempotency_ttl_s: float = IDEMPOTENCY_TTL_S
    response_ttl_s: float | None = None  # stored responses (`store: true`)
    task_ttl_s: float | None = None  # finished tasks themselves
    housekeeping_interval_s: float = 600.0

    @classmethod
    def from_config(cls, config: Config) -> StoreSettings:
        retention = float(config.event_retention)
        interval = config.housekeeping_interval
        return cls(
            event_retention_s=retention,
            response_ttl_s=config.stored_response_ttl,
            task_ttl_s=config.task_ttl,
            housekeeping_interval_s=float(interval) if interval else max(1.0, min(600.0, retention / 4)),
        )


class Daemon:
    def __init__(
        self,
        paths: Paths,
        config: Config,
        *,
        catalog: Any,
        vault: SecretVault | None = None,
        token_repository: TokenRepository | None = None,
    ) -> None:
        self.paths = paths
        self.config = config
        self.catalog = catalog
        self.runtime = Runtime()
        self.models = ModelManager(
            self.runtime,
            load_options(config, self.runtime),
            budget=memory_budget(config, self.runtime),
            keep_alive=config.keep_alive,
        )
        self.service = Service(
            config=config,
            catalog=catalog,
            models=self.models,
            capabilities=Capabilities((*Capabilities().names, "conversations")),
        )
        self.store_settings = settings = StoreSettings.from_config(config)
        self.db = Database(paths.database)
        try:
            self._queued = recover(self.db)  # before anything is served
        except BaseException:
            self.db.close()
            raise
        last_used = LastUsedBatcher()
        self.housekeeper = Housekeeper(
            self.db,
            event_retention_s=settings.event_retention_s,
            idempotency_ttl_s=settings.idempotency_ttl_s,
            response_ttl_s=settings.response_ttl_s,
            task_ttl_s=settings.task_ttl_s,
            interval_s=settings.housekeeping_interval_s,
            last_used=last_used,
        ).start()
        tokens = TokenManager(token_repository or StoreTokenRepository(self.db, last_used), vault or SecretVault())
        tokens.ensure_owner()
        self.auth = Auth(tokens=tokens, pairings=PairingBroker(tokens))
        self.conversations = Conversations(self.db)
        self.idempotency = Idempotency(self.db, ttl_s=settings.idempotency_ttl_s)
        self.responder = Responder(
            self.service, db=self.db, conversations=self.conversations, idempotency=self.idempotency
        )
        self.tasks = TaskManager(
            self.service,
            self.db,
            self.conversations,
            self.idempotency,
            max_running=config.parallel or MAX_DEFAULT_PARALLEL,
        )
        self.app = create_app(
            self.service, self.auth, responder=self.responder, conversations=self.conversations, tasks=self.tasks
        )
        self.watcher = FolderWatcher(catalog)
        self.watcher.subscribe(self._models_changed)
        self.url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False

    def _models_changed(self, _entries: Any, _added: set[str], removed: set[str]) -> None:
        """A model file went away: unload it once its running requests have finished."""
        for model_id in removed:
            if self.models.get(model_id) is not None:
                threading.Thread(
                    target=self.models.unload,
                    args=(model_id,),
                    kwargs={"drain": True},
                    name="lmsp-unload-removed",
                    daemon=True,
                ).start()

    # -- serving --------------------------------------------------------------------------------
    def _uvicorn_config(self, sock: socket.socket) -> uvicorn.Config:
        return uvicorn.Config(
            self.app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws="none",
            http="h11",  # h11 bounds an unfinished request head (httptools does not); security checks the rest
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            timeout_graceful_shutdown=5,
            server_header=False,
            date_header=True,
            fd=None,
        )

    def bind(self, port: int | None = None) -> socket.socket:
        """Bind the loopback socket (port 0 picks a free one)."""
        host = self.config.host if self.config.host != "localhost" else "127.0.0.1"
        if host not in ("127.0.0.1", "::1"):
            raise OSError(f"refusing to listen on {host}: lmsp-tray binds loopback only")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
        # connections whose socket says TCP. Without it every response after the first on a
        # kept-alive connection waits ~40 ms for the client's delayed ACK between two writes.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((host, self.config.port if port is None else port))
        except OSError:
            sock.close()
            raise
        sock.listen(128)
        sock.setblocking(False)
        bound_port = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{bound_port}/lmsp/v1"
        return sock

    async def _serve(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        server = _Server(self._uvicorn_config(sock))
        self._server = server
        self.tasks.resume(self._queued)  # tasks left queued by the last run start with the server
        serve_task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serve_task.done():
            await asyncio.sleep(0.01)
        if server.started and self.url:
            write_discovery_file(self.paths, self.url, self._discovery_owner_id())
            self.watcher.start()
            log.info("lmsp-tray %s serving %s", __version__, self.url)
        self._started.set()
        try:
            await serve_task
        finally:
            await self.tasks.stop()  # running tasks write their terminal events before the loop ends
            # Model processes end while the loop still runs: no model thread calls into a closed loop,
            # and calls waiting on a model (tokenizing a huge input) fail now instead of holding the
            # executor that asyncio.run waits for.
            await asyncio.to_thread(self.models.close)

    def serve_forever(self, sock: socket.socket) -> None:
        """Serve in the foreground until SIGTERM/SIGINT (headless mode)."""
        stop = threading.Event()

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            if stop.is_set():
                return
            self.request_stop()
            stop.set()
            threading.Thread(
                target=self._exit_deadline, args=(serve_done,), name="lmsp-exit-deadline", daemon=True
            ).start()

        serve_done = threading.Event()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            asyncio.run(self._serve(sock))
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            try:
                self.close()
            finally:
                serve_done.set()

    def _exit_deadline(self, done: threading.Event) -> None:
        """Whatever the load, a stop requested by a signal ends the process within EXIT_DEADLINE_S:
        past it, the discovery file goes and the process exits (unfinished tasks are ended at the
        next start, as after a crash)."""
        if done.wait(EXIT_DEADLINE_S):
            return
        log.error("the service did not stop within %.0f s; exiting now", EXIT_DEADLINE_S)
        remove_discovery_file(self.paths)
        closing = threading.Thread(target=self.db.close, name="lmsp-last-commit", daemon=True)
        closing.start()  # what is already queued for the store still gets a few seconds to land
        closing.join(3.0)
        logging.shutdown()
        os._exit(0)

    def start_background(self, sock: socket.socket) -> None:
        """Serve on a background thread (under the tray, and in tests); returns once listening."""

        def run() -> None:
            try:
                asyncio.run(self._serve(sock))
            except BaseException as exc:  # noqa: BLE001 - surfaced to the starter, who re-raises it
                self._startup_error = exc
                self._started.set()

        self._thread = threading.Thread(target=run, name="lmsp-http", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._startup_error is not None:
            raise RuntimeError(f"the HTTP server did not start: {self._startup_error}")

    def request_stop(self) -> None:
        """Stop accepting, end open streams with their terminal event, then stop the server."""
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        def begin() -> None:
            self.tasks.begin_shutdown()  # running tasks end failed/service_unavailable, queued stay queued
            self.service.cancel_all()
            loop.call_later(0.2, setattr, server, "should_exit", True)

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(begin)

    @property
    def serving(self) -> bool:
        """Whether the background server thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop_background(self, timeout: float = 10.0) -> None:
        """Stop like SIGTERM does and wait for it (safe to call again: later calls do nothing)."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        remove_discovery_file(self.paths)
        self.watcher.stop()
        self.models.close()
        self.runtime.close()
        self.housekeeper.stop()
        self.db.close()  # commits whatever is still queued

    def _discovery_owner_id(self) -> str | None:
        """The owner token's id for the discovery file (an id, not a secret: the CLI finds the
        secret in the keyring), or None when it lives only in memory."""
        tokens = self.auth.tokens
        return tokens.owner_id if tokens.owner_id and not tokens.owner_ephemeral else None
