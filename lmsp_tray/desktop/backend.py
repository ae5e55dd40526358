"""The daemon as the tray sees it: `DaemonTrayBackend`, the `TrayBackend` over a live `Daemon`.

`lmsp_tray.desktop.tray` knows nothing of the service; it talks to a `TrayBackend`.
This module implements that protocol over the live `Daemon`, in process (no
HTTP): the menu's model list is the catalog plus the `ModelManager`'s states
(files that are not usable models are listed apart and not counted), a click on
a model calls `ModelManager.acquire` / `unload` directly (the tray runs clicks on
worker threads, so a load may block for seconds), Rescan is the folder watcher's
rescan, and Quit stops the daemon the same way SIGTERM does (open streams end
with a terminal event, models unload, the discovery file goes). What puts this
backend, the tray and the service's notifications together is
`lmsp_tray.desktop.compose.run_tray`.

`TrayHooks` is the one place the daemon hands the tray its owner token,
pairing requests and keyring trouble: see `tray_hooks()` below. The desktop
notifications the service raises meanwhile (pairing requests with Approve/Deny,
the keyring working again, a download ending, a model whose process crashed,
the first run's welcome) are `lmsp_tray.desktop.service_notices`; the menu shows
a crashed model's reason beside the model.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmsp_tray.desktop.menu import (
    ALL_PAIRINGS,
    MODEL_ERROR,
    DownloadView,
    ModelView,
    OllamaPortView,
    PairingView,
    ProblemFile,
    TrayState,
    display_path,
    full_reason,
    human_size,
    short_reason,
)
from lmsp_tray.engine.devices import BACKEND_NAMES
from lmsp_tray.errors import LMSPError, ModelNotFound

if TYPE_CHECKING:
    from lmsp_tray.daemon import Daemon
    from lmsp_tray.desktop.autostart import Autostart

log = logging.getLogger("lmsp_tray.desktop.tray")

OLLAMA_PORT = 11434  # Ollama's own port, where its apps knock; what the menu item turns on


def compute_text(devices: Any, gpu_setting: str = "auto") -> str:
    """Where the models run, in a few words: the GPUs llama.cpp offloads to (backend, device, memory),
    else the CPU and why not a GPU."""
    gpus = tuple(getattr(devices, "gpus", ()) or ())
    cpu = next((d for d in getattr(devices, "devices", ()) if d.type == "cpu"), None)
    on_cpu = f"the CPU ({cpu.description})" if cpu is not None and cpu.description else "the CPU"
    if gpus and gpu_setting != "off":
        backend = BACKEND_NAMES.get(devices.backend, devices.backend)
        shown = ", ".join(f"{g.description or g.name} ({human_size(g.total_bytes)})" for g in gpus)
        return f"{backend}: {shown}"
    if devices is None or getattr(devices, "error", None):
        return f"{on_cpu}: the device probe failed"
    if gpus:
        return f"{on_cpu}: GPU off in the settings"
    if devices.cpu_fallback:
        return f"{on_cpu}: llama.cpp's {BACKEND_NAMES.get(devices.backend, devices.backend)} sees no device"
    return f"{on_cpu}: llama.cpp is built without a GPU backend"


# -- hooks the security work fills in ---------------------------------------------------------------


class PairingLike(Protocol):
    """What the tray reads of a pending pairing request (security's `PairingView` has these)."""

    @property
    def id(self) -> str: ...
    @property
    def app_name(self) -> str: ...
    @property
    def scopes(self) -> Sequence[str]: ...
    @property
    def user_code(self) -> str: ...


def _no_token() -> str | None:
    return None


def _no_pairings() -> Sequence[PairingLike]:
    return ()


def _no_pairing_action(_pairing_id: str) -> Any:
    raise LMSPError("Pairing requests are not supported by this build.")


def _no_subscription(_listener: Callable[..., None]) -> None:
    return None


def _no_notice() -> str | None:
    return None


@dataclass(frozen=True)
class TrayHooks:
    """How the tray reaches the owner token and pairing requests (defaults: none of either).

    - `access_token()`: the owner token's secret (only ever put on the clipboard), or None.
    - `pending_pairings()`: the requests waiting for the user (objects with id, app_name,
      scopes, user_code).
    - `approve_pairing(id)` / `deny_pairing(id)`: the user's answer; raise with a human message;
      `deny_all_pairings()`: every pending request denied at once (a flood dismissed).
    - `subscribe_pairings(listener)`: register `listener(*anything)` to be called when a
      request arrives or ends, so the menu shows it at once (else within the 0.5 s poll).
    """

    access_token: Callable[[], str | None] = _no_token
    pending_pairings: Callable[[], Sequence[PairingLike]] = _no_pairings
    approve_pairing: Callable[[str], Any] = _no_pairing_action
    deny_pairing: Callable[[str], Any] = _no_pairing_action
    deny_all_pairings: Callable[[], Any] = lambda: _no_pairing_action("*")
    subscribe_pairings: Callable[[Callable[..., None]], None] = _no_subscription
    notice: Callable[[], str | None] = _no_notice  # a service-level problem to show on top of the menu
    session_token: Callable[[], bool] = lambda: False  # the owner token dies with this run (no keyring)


def keyring_notice(reason: str, token_file: Path | None) -> str:
    """What the menu says while the keyring cannot be used (the whole text; the menu cuts it)."""
    kept = (
        f" The owner token for the CLI is kept in {token_file} (only you can read it) until lmsp-tray stops."
        if token_file is not None
        else ""
    )
    return f"Keyring unavailable: {reason}. Tokens still work; new secrets cannot be saved.{kept}"


def tray_hooks(daemon: Daemon) -> TrayHooks:
    """The owner token, pairing requests and keyring trouble of a live daemon (`daemon.auth`)."""
    auth = daemon.auth

    def notice() -> str | None:
        error = auth.tokens.keyring_error
        if error is None:
            return None
        return keyring_notice(error.reason, daemon.owner_token_file if auth.tokens.owner_ephemeral else None)

    return TrayHooks(
        access_token=lambda: auth.tokens.owner_secret,
        pending_pairings=auth.pairings.pending_pairings,
        approve_pairing=auth.pairings.approve,
        deny_pairing=auth.pairings.deny,
        deny_all_pairings=auth.pairings.deny_all,
        subscribe_pairings=auth.pairings.add_listener,
        notice=notice,
        session_token=lambda: auth.tokens.owner_ephemeral,
    )


# -- the backend ------------------------------------------------------------------------------------


class DaemonTrayBackend:
    """`TrayBackend` over a live `Daemon`. Every method is thread-safe; load/unload block."""

    def __init__(self, daemon: Daemon, autostart: Autostart, hooks: TrayHooks | None = None) -> None:
        self.daemon = daemon
        self.autostart = autostart
        self.hooks = hooks if hooks is not None else TrayHooks()
        self._autostart_failing = False
        self._config_stamp: int | None = -1  # config.toml's mtime when `ollama_port` was last read from it
        self._config_ollama: int | None = None

    # -- state ------------------------------------------------------------------------------------
    def snapshot(self) -> TrayState:
        """The catalog's models with their live states; cheap (no disk reads but the autostart entry)."""
        d = self.daemon
        entries = d.catalog.entries()
        models = tuple(self._model_view(entry) for entry in entries if not entry.error)
        problems = [self._problem(e.path, e.error, e.incomplete) for e in entries if e.error]
        problems += [self._problem(f.path, f.error, True) for f in d.catalog.incomplete_files()]
        enabled, supported = self._autostart_status()
        return TrayState(
            url=d.url,
            models=models,
            autostart_enabled=enabled,
            autostart_supported=supported,
            pairings=self._pairings(),
            token_available=self._token_available(),
            notice=self._with_keyless(self._notice()),
            problems=tuple(sorted(problems, key=lambda p: p.file_name.lower())),
            models_folder=display_path(d.paths.models_dir),
            token_session_only=self._session_token(),
            downloads=self._downloads(),
            compute=compute_text(d.devices, getattr(d.config, "gpu", "auto")),
            ollama=self._ollama(),
        )

    def _ollama(self) -> OllamaPortView:
        """`ollama_port` as config.toml says now (it may have changed since the start: the console, this
        menu) and as it runs."""
        d = self.daemon
        running = getattr(d.config, "ollama_port", None)
        wanted = self._configured_ollama_port(running)
        return OllamaPortView(
            wanted or running or OLLAMA_PORT,
            wanted is not None,
            getattr(d, "ollama_url", None) is not None,
            taken=getattr(d, "ollama_refused", None) is not None and wanted == running,
        )

    def _configured_ollama_port(self, running: int | None) -> int | None:
        """`ollama_port` in config.toml, read again only when the file changed; `running` where there is no
        file (set on the command line) or it cannot be read."""
        path = self.daemon.paths.config_file
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp != self._config_stamp:
            self._config_stamp = stamp
            self._config_ollama = running
            if stamp is not None:
                try:
                    with path.open("rb") as fh:
                        raw = tomllib.load(fh)
                    port = raw.get("ollama_port", raw.get("ollama-port"))
                    self._config_ollama = port if isinstance(port, int) and port > 0 else None
                except (OSError, tomllib.TOMLDecodeError):
                    pass  # being written, or broken: the running value until it can be read
        return self._config_ollama

    def _downloads(self) -> tuple[DownloadView, ...]:
        downloads = getattr(self.daemon, "downloads", None)
        if downloads is None:
            return ()
        return tuple(
            DownloadView(
                s.task_id, s.ref, s.bytes_done, s.bytes_total, s.bytes_per_second, s.eta_seconds, s.state == "queued"
            )
            for s in downloads.active()
            if s.state in ("queued", "running")
        )

    @staticmethod
    def _problem(path: Path, error: str | None, incomplete: bool) -> ProblemFile:
        return ProblemFile(path.name, full_reason(error or "unknown problem"), display_path(path.parent), incomplete)

    def _model_view(self, entry: Any) -> ModelView:
        info = entry.info
        quantization = info.quantization if info else None
        file_name = None if entry.source == "ollama" else entry.path.name  # Ollama's blobs have hash names
        state, error = self.daemon.models.state(entry.id)
        reason = None
        if state == MODEL_ERROR:
            reason = (error.detail if isinstance(error, LMSPError) else str(error or "")) or "could not load"
        loaded = self.daemon.models.get(entry.id)
        generating = loaded is not None and loaded.busy
        return ModelView(entry.id, entry.size_bytes, quantization, state, reason, generating, file_name)

    def _session_token(self) -> bool:
        try:
            return bool(self.hooks.session_token())
        except Exception:  # noqa: BLE001
            return False

    def _autostart_status(self) -> tuple[bool, bool]:
        try:
            supported = self.autostart.supported
            enabled = supported and self.autostart.is_enabled()
        except Exception as exc:  # noqa: BLE001 - an unreadable entry must not break the menu
            if not self._autostart_failing:
                log.warning("cannot read the start-at-login setting: %s", short_reason(exc, 120))
            self._autostart_failing = True
            return False, False
        self._autostart_failing = False
        return enabled, supported

    def _pairings(self) -> tuple[PairingView, ...]:
        try:
            pending = self.hooks.pending_pairings()
        except Exception as exc:  # noqa: BLE001
            log.debug("pairing requests unavailable: %s", exc)
            return ()
        return tuple(
            PairingView(str(p.id), str(p.app_name or ""), tuple(str(s) for s in p.scopes or ()), str(p.user_code or ""))
            for p in pending
        )

    def _notice(self) -> str | None:
        try:
            return self.hooks.notice()
        except Exception as exc:  # noqa: BLE001
            log.debug("notice unavailable: %s", exc)
            return None

    def _with_keyless(self, notice: str | None) -> str | None:
        """The notice, and while `keyless_scopes` is on a line saying what every local app may do
        without a token: that opening must stay visible."""
        scopes = getattr(self.daemon.config, "keyless_scopes", None)
        if not scopes:
            return notice
        note = f"Apps without a token may use: {', '.join(scopes)} (keyless_scopes in config.toml)"
        return f"{notice}\n{note}" if notice else note

    def _token_available(self) -> bool:
        # Only whether the hook is connected: asking the keyring every 0.5 s is too slow
        # (0.1-0.3 s per call); a missing secret is reported when the user clicks.
        return self.hooks.access_token is not _no_token

    # -- actions ----------------------------------------------------------------------------------
    def _entry(self, model_id: str) -> Any:
        entry = self.daemon.catalog.get(model_id)
        if entry is None:
            raise ModelNotFound(f"'{model_id}' is no longer in the models folders; choose Rescan models.")
        return entry

    def load_model(self, model_id: str) -> None:
        """Load (blocking, seconds for a big model); the keep-alive is the same as an API load."""
        self.daemon.models.acquire(self._entry(model_id))

    def unload_model(self, model_id: str) -> None:
        """Unload once its running requests have finished (also clears a failed load)."""
        self.daemon.models.unload(model_id, drain=True)

    def unload_all(self) -> None:
        self.daemon.models.unload_all(drain=True)

    def rescan(self) -> None:
        self.daemon.watcher.rescan()

    def models_folder(self) -> Path:
        return self.daemon.paths.models_dir

    def open_console(self) -> None:
        """The console in the default browser, through a redirect file (`console_link`)."""
        from lmsp_tray.console_link import open_in_browser

        open_in_browser(self.daemon.paths, self.daemon.console_link())

    def access_token(self) -> str | None:
        return self.hooks.access_token()

    def set_autostart(self, enabled: bool) -> None:
        self.autostart.set(enabled)

    def approve_pairing(self, pairing_id: str) -> None:
        self.hooks.approve_pairing(pairing_id)

    def deny_pairing(self, pairing_id: str) -> None:
        if pairing_id == ALL_PAIRINGS:
            self.hooks.deny_all_pairings()
        else:
            self.hooks.deny_pairing(pairing_id)

    def cancel_download(self, task_id: str) -> None:
        downloads = getattr(self.daemon, "downloads", None)
        if downloads is None or not downloads.cancel_soon(task_id):
            raise RuntimeError("that download has already ended")

    def set_ollama_port(self, enabled: bool) -> None:
        """Write `ollama_port` to config.toml as the console's settings do (Ollama's port, or removed);
        the listener opens or closes at the next start."""
        view = self._ollama()
        self.daemon.settings.update({"ollama_port": view.port if enabled else None})

    def quit(self) -> None:
        """The user chose Quit: end open streams with a terminal event, stop serving, unload."""
        log.info("Quit chosen in the tray, shutting down")
        self.daemon.stop_background()
