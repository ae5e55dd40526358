"""The composition root: builds every part, serves the API, and shuts down cleanly.

Nothing else in the package constructs long-lived objects. `Daemon` asks
once what llama.cpp sees (`engine.devices.probe`, a short-lived process: this
one never loads llama.cpp), builds the model manager and the service from
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

Downloads (`serving.downloads` over `hub.pull`): pulls go to the Hugging Face
cache discovery scans, sized by the same load planner and memory budget the
models load with; a pulled model is rescanned into the catalog before its task
ends. Downloads a stop or crash interrupted go back to the queue at start-up and
resume with the server.

Without a keyring the owner token of this run is written to the owner token
file (`auth.vault.OwnerTokenFile`, in the runtime folder) once the socket
serves, so `lmsp-tray tokens …` can reach the service; the keyring is tried
again every `keyring_retry` seconds, and once it works the file goes and the
discovery file names the new persistent owner token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from lmsp_tray import __version__
from lmsp_tray.auth.console import ConsoleAccess
from lmsp_tray.auth.pairing import Auth, PairingBroker
from lmsp_tray.auth.tokens import StoreTokenRepository, TokenManager, TokenRepository
from lmsp_tray.auth.vault import OwnerTokenFile, SecretVault, TokenFileError
from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.catalog import Catalog
from lmsp_tray.discovery.sources import default_sources, huggingface_hub_dir
from lmsp_tray.discovery.watch import FolderWatcher
from lmsp_tray.engine.devices import Devices, physical_cores, probe
from lmsp_tray.engine.load_plan import MAX_DEFAULT_PARALLEL, LoadOptions
from lmsp_tray.engine.manager import DEFAULT, MemoryBudget, ModelManager, gpu_free
from lmsp_tray.http.app import APIS, create_app
from lmsp_tray.http.body_parser import BodyParser
from lmsp_tray.http.connections import ConnectionLimits, descriptor_budget, guarded_protocol
from lmsp_tray.http.console_routes import CONSOLE_PATH, ConsoleParts
from lmsp_tray.http.model_routes import ModelParts
from lmsp_tray.http.security import MAX_HEAD_BYTES
from lmsp_tray.hub.fit import Machine
from lmsp_tray.hub.owned import Ledger
from lmsp_tray.hub.pull import Puller
from lmsp_tray.hub.search import HubSearch
from lmsp_tray.instance import (
    SERVICE,
    InstanceBusy,
    InstanceLock,
    read_info,
    remove_discovery_file,
    write_discovery_file,
    write_info,
)
from lmsp_tray.protocol.downloads import KIND as DOWNLOAD_KIND
from lmsp_tray.serving.activity import ActivityLog, LogBuffer, Sampler, watch_service
from lmsp_tray.serving.conversations import Conversations
from lmsp_tray.serving.downloads import DownloadTasks
from lmsp_tray.serving.model_removal import ModelRemover
from lmsp_tray.serving.model_settings import ModelSettingsEditor, model_loads
from lmsp_tray.serving.recovery import recover
from lmsp_tray.serving.replay import Idempotency
from lmsp_tray.serving.responder import Responder
from lmsp_tray.serving.service import Capabilities, Service
from lmsp_tray.serving.settings import LoginItem, Settings
from lmsp_tray.serving.tasks import TaskManager
from lmsp_tray.store import Housekeeper, LastUsedBatcher
from lmsp_tray.store.idempotency_keys import IDEMPOTENCY_TTL_S
from lmsp_tray.store.salvage import open_store

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


def load_options(config: Config, devices: Devices, paths: Paths | None = None) -> LoadOptions:
    """How models load; with `paths`, their prompt cache goes under the cache folder (if turned on)."""
    cache = paths is not None and config.prompt_cache_gib > 0
    return LoadOptions(
        prompt_cache_dir=str(paths.prompt_cache_dir) if paths is not None and cache else None,
        prompt_cache_bytes=int(config.prompt_cache_gib * (1 << 30)) if cache else 0,
        context_cap=config.context_cap,
        parallel=config.parallel,
        threads=config.threads,
        gpu=config.gpu,
        gpu_layers=config.gpu_layers,
        max_queue=config.max_queue,
        speculative=config.speculative,
        kv_budget_bytes=kv_budget(config),
        allocator=config.allocator,
    )


def downloads_ledger(paths: Paths) -> Path:
    """Where pulls record what they put in the Hugging Face cache (`hub.owned`): what may be deleted."""
    return paths.data_dir / "downloads.json"


def _total_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def kv_budget(config: Config) -> int | None:
    """A quarter of the memory budget may go to the KV caches of parallel sequences."""
    total = _total_ram()
    return None if total is None else int(total * config.memory_budget_fraction / 4)


def memory_budget(config: Config, devices: Devices) -> MemoryBudget:
    """At most `max_loaded_models`, within a share of RAM (and of VRAM when a GPU is used)."""
    total = _total_ram()
    vram = devices.gpu_total_bytes
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


def claim(paths: Paths) -> InstanceLock:
    """Take this home's instance lock, or raise `InstanceBusy` naming who holds it."""
    lock = InstanceLock(paths)
    if not lock.acquire():
        holder = read_info(paths)
        who = f" (pid {holder.pid}{', ' + holder.url if holder.url else ''})" if holder else ""
        raise InstanceBusy(f"another lmsp-tray uses the data folder {paths.data_dir}{who}")
    write_info(paths, SERVICE)
    return lock


class Daemon:
    def __init__(
        self,
        paths: Paths,
        config: Config,
        *,
        catalog: Any,
        vault: SecretVault | None = None,
        token_repository: TokenRepository | None = None,
        lock: InstanceLock | None = None,
        login_item: LoginItem | None = None,
        reveal: Callable[[Path], object] | None = None,
        devices: Devices | None = None,
    ) -> None:
        """`login_item` (start at login) and `reveal` (show a folder in the file manager) come from
        the desktop layer when there is one; the console's settings and "open folder" use them.
        `devices`: what llama.cpp sees, when already known (None: ask the device probe)."""
        self.paths = paths
        self.config = config
        self.catalog = catalog
        # One instance per home: the lock (the CLI's, taken earlier, or our own) before the database.
        self.lock = lock if lock is not None else claim(paths)
        # What llama.cpp sees, asked once of a short-lived process: this one never loads llama.cpp.
        self.devices = devices if devices is not None else probe()
        self.models = ModelManager(
            self.devices,
            load_options(config, self.devices, paths),
            budget=memory_budget(config, self.devices),
            keep_alive=config.keep_alive,
            per_model=model_loads(config.models),
            find=catalog.resolve,  # the draft models the per-model settings name
        )
        self.service = Service(
            config=config,
            catalog=catalog,
            models=self.models,
            capabilities=Capabilities((*Capabilities().names, "conversations")),
        )
        self.ledger = Ledger(downloads_ledger(paths))
        self.remover = ModelRemover(
            self.models,
            models_dir=paths.models_dir,
            hf_cache=huggingface_hub_dir(os.environ, Path.home()),
            ledger=self.ledger,
            rescan=lambda: self.watcher.rescan(),
        )
        self.service.removal = self.remover
        self.store_settings = settings = StoreSettings.from_config(config)
        try:
            # A damaged database is moved aside (never deleted) and a new one opened: `store_set_aside`
            # says so, for the start-up to tell the person; a newer schema still refuses (SchemaTooNew).
            self.db, self.store_set_aside = open_store(paths.database)
        except BaseException:
            self.lock.release()
            raise
        try:
            self._queued = recover(self.db)  # before anything is served
        except BaseException:
            self.db.close()
            self.lock.release()
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
        tokens.add_keyring_listener(self._keyring_changed)
        self.auth = Auth(tokens=tokens, pairings=PairingBroker(tokens))
        self.owner_token_file = paths.runtime_dir / "owner-token"
        self._keyring_stop = threading.Event()
        self._keyring_thread: threading.Thread | None = None
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
            max_queued_per_owner=config.max_queued_tasks,
        )
        self.downloads = DownloadTasks(
            self._puller(catalog), self.db, model_for=self._downloaded_model, idempotency=self.idempotency
        )
        self._queued_downloads = self.downloads.recover()  # a download the last run left resumes
        self.tasks.register_kind(DOWNLOAD_KIND, self.downloads)
        self.console_access = ConsoleAccess(tokens)
        self.activity = ActivityLog(output_tokens=self.service.output_tokens, models_bytes=self._models_bytes)
        watch_service(self.activity, self.service)
        self._log_buffer = LogBuffer(self.activity)
        self._sampler = Sampler(self.activity)
        self.settings = Settings(paths, self._running_config, apply=self.apply_settings, login_item=login_item)
        self.model_settings = ModelSettingsEditor(self.settings, apply=self.apply_settings)
        self.bodies = BodyParser()  # big request bodies are parsed in its worker process (closed in _serve)
        self.app = create_app(
            self.service,
            self.auth,
            responder=self.responder,
            conversations=self.conversations,
            tasks=self.tasks,
            downloads=self.downloads,
            console=ConsoleParts(self.console_access, self.activity, self.settings, reveal, self._store_bytes),
            models=ModelParts(
                settings=self.model_settings, remover=self.remover, search=HubSearch(self.downloads.puller)
            ),
            bodies=self.bodies,
        )
        self.watcher = FolderWatcher(catalog)
        self.watcher.subscribe(self._models_changed)
        self.url: str | None = None
        self.port: int | None = None  # the port bound (config.port, or a free one for port 0)
        self.ollama_url: str | None = None  # the second listener for Ollama's apps, when `ollama_port` got it
        self.ollama_refused: str | None = None  # why `ollama_port` was not used (taken), for the person
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False

    # -- downloads --------------------------------------------------------------------------------
    def _puller(self, catalog: Any) -> Puller:
        """Pulls into the Hugging Face cache discovery scans, sized by the planner the models load with."""
        guard = getattr(catalog, "holding_scans", None)
        return Puller(
            huggingface_hub_dir(os.environ, Path.home()),
            options=load_options(self.config, self.devices),
            machine=self._machine,
            ledger=self.ledger,
            **({"publish_guard": guard} if guard is not None else {}),
        )

    def _machine(self) -> Machine:
        budget = memory_budget(self.config, self.devices)
        gpu = self.config.gpu != "off" and self.devices.has_gpu
        return Machine(
            ram_budget=budget.ram_bytes,
            vram_budget=budget.vram_bytes,
            gpu_free=gpu_free(self.devices) if gpu else None,
            cores=physical_cores(),
            ram_total=_total_ram(),
        )

    def _downloaded_model(self, path: Path) -> dict[str, Any] | None:
        """The model object of a file a download just linked in (after a rescan: it is in GET /models now)."""
        self.watcher.rescan()
        entry = next((e for e in self.catalog.entries() if Path(e.path) == path), None)
        return None if entry is None else self.service.model_object(entry)

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

    # -- the console and its settings ------------------------------------------------------------
    def console_link(self) -> str:
        """A console URL with a fresh single-use code in its fragment (for the tray; good for a minute)."""
        if self.url is None:
            raise RuntimeError("the service is not listening yet")
        code = self.console_access.issue_code()
        return f"{self.url.removesuffix('/lmsp/v1')}{CONSOLE_PATH}#code={code.code}"

    def _running_config(self) -> Config:
        """The configuration in effect, with the port actually bound."""
        return dataclasses.replace(self.config, port=self.port or self.config.port)

    def _store_bytes(self) -> int:
        """The database's files on disk (with its write-ahead log)."""
        files = [self.paths.database.with_name(self.paths.database.name + s) for s in ("", "-wal", "-shm")]
        return sum(f.stat().st_size for f in files if f.exists())

    def _models_bytes(self) -> int:
        """Memory the loaded models take by their load plans (weights, KV cache, buffers; RAM and VRAM)."""
        return sum(m.plan.ram_bytes + m.plan.vram_bytes for m in self.models.loaded())

    def apply_settings(self, values: Mapping[str, Any]) -> None:
        """Settings changed in the console: folders rescan now, keep-alive applies to loaded models,
        the rest to the next load (`settings.FIELDS` says which is which; the port needs a restart)."""
        config = dataclasses.replace(self.config, **dict(values))
        self.config = self.service.config = config
        if {"models_dirs", "default_dirs"} & values.keys() and isinstance(self.catalog, Catalog):
            self.catalog.replace_sources(default_sources(self.paths, config))
            self.watcher.rescan()
        self.models.reconfigure(
            load_options(config, self.devices, self.paths),
            memory_budget(config, self.devices),
            keep_alive=config.keep_alive if "keep_alive" in values else DEFAULT,
            per_model=model_loads(config.models),
        )
        log.info("settings changed: %s", ", ".join(sorted(values)))

    # -- serving --------------------------------------------------------------------------------
    def _uvicorn_config(self, sock: socket.socket) -> uvicorn.Config:
        limits = ConnectionLimits(
            head_timeout=self.config.request_head_timeout,
            body_timeout=self.config.request_body_timeout,
            idle_timeout=self.config.idle_timeout,
            max_connections=descriptor_budget(self.config.max_connections),
        )
        return uvicorn.Config(
            self.app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws="none",
            # h11 bounds an unfinished request head (httptools does not); the guarded protocol adds deadlines,
            # a connection cap and the smuggling check (http/connections.py); security checks the rest
            http=guarded_protocol(limits, APIS),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            timeout_keep_alive=max(1, round(limits.idle_timeout)),
            timeout_graceful_shutdown=5,
            server_header=False,
            date_header=True,
            fd=None,
        )

    def bind(self, port: int | None = None) -> socket.socket:
        """Bind the loopback socket (port 0 picks a free one)."""
        sock, host = self._loopback_socket(self.config.port if port is None else port)
        bound_port = self.port = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound_port}/lmsp/v1"
        return sock

    def _loopback_socket(self, port: int) -> tuple[socket.socket, str]:
        """A listening, non-blocking TCP socket on the configured loopback address, and that address."""
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
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.listen(128)
        sock.setblocking(False)
        return sock, host

    def _ollama_sockets(self) -> list[socket.socket]:
        """The opt-in second listener for Ollama's apps (`ollama_port`): the same app on Ollama's port, only
        when that port is free — a running Ollama keeps it, and the person is told where the API is instead."""
        port = self.config.ollama_port
        if not port:
            return []
        try:
            sock, host = self._loopback_socket(port)
        except OSError as exc:
            self.ollama_refused = (
                f"Port {port} (ollama_port) is taken ({exc.strerror or exc}; perhaps Ollama itself is running): it "
                f"is left alone, and the Ollama-compatible API stays at {(self.url or '').removesuffix('/lmsp/v1')} "
                "on this service's own port."
            )
            log.warning("%s", self.ollama_refused)
            return []
        shown = f"[{host}]" if ":" in host else host
        self.ollama_url = f"http://{shown}:{sock.getsockname()[1]}"
        log.info("serving the Ollama-compatible API on %s too (ollama_port)", self.ollama_url)
        return [sock]

    async def _serve(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        server = _Server(self._uvicorn_config(sock))
        self._server = server
        self.tasks.resume(self._queued)  # tasks left queued by the last run start with the server
        self.downloads.resume(self._queued_downloads)
        serve_task = asyncio.ensure_future(server.serve(sockets=[sock, *self._ollama_sockets()]))
        while not server.started and not serve_task.done():
            await asyncio.sleep(0.01)
        if server.started and self.url:
            self._publish_owner_token()
            write_info(self.paths, SERVICE, url=self.url)  # the CLI finds us here, whatever its runtime folder
            write_discovery_file(self.paths, self.url, self._discovery_owner_id())
            self.watcher.start()
            self._start_keyring_retry()
            logging.getLogger("lmsp_tray").addHandler(self._log_buffer)
            self._sampler.start()
            log.info("lmsp-tray %s serving %s", __version__, self.url)
        self._started.set()
        try:
            await serve_task
        finally:
            await self.tasks.stop()  # running tasks write their terminal events before the loop ends
            await self.downloads.stop()  # running downloads pause (queued again, resumed at the next start)
            # Model processes end while the loop still runs: no model thread calls into a closed loop,
            # and calls waiting on a model (tokenizing a huge input) fail now instead of holding the
            # executor that asyncio.run waits for.
            await asyncio.to_thread(self.models.close)
            await asyncio.to_thread(self.bodies.close)

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
            self.downloads.begin_shutdown()
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
        self._keyring_stop.set()
        remove_discovery_file(self.paths)
        if self.auth.tokens.owner_ephemeral:
            OwnerTokenFile(self.owner_token_file).remove()
        self._sampler.stop()
        logging.getLogger("lmsp_tray").removeHandler(self._log_buffer)
        self.watcher.stop()
        self.models.close()
        self.bodies.close()
        self.housekeeper.stop()
        self.db.close()  # commits whatever is still queued
        self.lock.release()  # last: a new instance may open the database now

    # -- the owner token without a keyring ---------------------------------------------------------
    def _publish_owner_token(self) -> None:
        """Without a keyring: the session owner token into the owner token file, for the CLI."""
        tokens = self.auth.tokens
        token_file = OwnerTokenFile(self.owner_token_file)
        if not tokens.owner_ephemeral or not tokens.owner_secret:
            token_file.remove()  # a stale one from a run that was killed
            return
        try:
            token_file.write(tokens.owner_secret)
            log.info(
                "the keyring is unavailable: the owner token of this run is in %s (only you can read it)",
                token_file.path,
            )
        except (OSError, TokenFileError) as exc:
            log.warning("could not write the owner token file %s: %s", token_file.path, exc)

    def _keyring_changed(self, error: Any) -> None:
        """The keyring works again: the persistent owner token is in it now; name it in the discovery file,
        then drop the file (in that order: a CLI reading between the two finds one or the other, never neither)."""
        if error is not None or self._closed:
            return
        if self.url:
            write_discovery_file(self.paths, self.url, self._discovery_owner_id())
        OwnerTokenFile(self.owner_token_file).remove()

    def _start_keyring_retry(self) -> None:
        interval = self.config.keyring_retry
        if not interval or self._keyring_thread is not None:
            return

        def run() -> None:
            while not self._keyring_stop.wait(interval):
                if self.auth.tokens.keyring_error is not None:
                    try:
                        self.auth.tokens.retry_keyring()
                    except Exception:
                        log.debug("keyring retry failed", exc_info=True)

        self._keyring_thread = threading.Thread(target=run, name="lmsp-keyring-retry", daemon=True)
        self._keyring_thread.start()

    def _discovery_owner_id(self) -> str | None:
        """The owner token's id for the discovery file (an id, not a secret: the CLI finds the
        secret in the keyring), or None when it lives only in memory."""
        tokens = self.auth.tokens
        return tokens.owner_id if tokens.owner_id and not tokens.owner_ephemeral else None
