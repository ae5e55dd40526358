"""Where lmsp-tray keeps its files, and the settings a user can change.

Paths come from platformdirs, or all sit under one folder when
``LMSP_TRAY_HOME`` is set (tests, portable installs). Settings come from
``config.toml`` in the config folder, then from command-line overrides.
Nothing is read at import time: the daemon calls `resolve_paths` and
`load_config` once and passes the results down.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmsp_tray.private import private_dir, tighten

APP_NAME = "lmsp-tray"
DEFAULT_PORT = 7373
# What `keyless_scopes` may grant to requests without a valid token: using models, never managing
# them, tokens, settings, or reading the activity log.
KEYLESS_ALLOWED = ("models:read", "responses:create", "responses:read", "tasks:create", "tasks:read")
HOME_ENV = "LMSP_TRAY_HOME"


@dataclass(frozen=True)
class Paths:
    """Every folder and well-known file the service uses."""

    config_dir: Path
    data_dir: Path
    cache_dir: Path
    runtime_dir: Path

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def models_dir(self) -> Path:
        """The service's own models folder (the demo model is assembled here)."""
        return self.data_dir / "models"

    @property
    def database(self) -> Path:
        return self.data_dir / "lmsp-tray.sqlite3"

    @property
    def discovery_file(self) -> Path:
        """`service.json`: where a running daemon says where it listens."""
        return self.runtime_dir / "service.json"

    @property
    def prompt_cache_dir(self) -> Path:
        """Saved KV states of conversations (`engine.prompt_cache`), restored after unload or restart."""
        return self.cache_dir / "prompt-cache"

    @property
    def log_dir(self) -> Path:
        return self.cache_dir / "logs"

    def ensure(self) -> Paths:
        """Make the folders, private to the user (0700; the database and logs 0600), tightening an
        existing install made under a looser umask (`lmsp_tray.private`)."""
        for folder in (self.config_dir, self.data_dir, self.cache_dir, self.log_dir, self.runtime_dir):
            private_dir(folder)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        database = [self.database.with_name(self.database.name + suffix) for suffix in ("", "-wal", "-shm")]
        logs = list(self.log_dir.iterdir()) if self.log_dir.is_dir() else []
        tighten([*database, *logs, self.config_file])
        return self


def resolve_paths(environ: Mapping[str, str] | None = None) -> Paths:
    """The folders for this user: under ``LMSP_TRAY_HOME`` if set, else platformdirs."""
    env = os.environ if environ is None else environ
    home = env.get(HOME_ENV)
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(root / "config", root / "data", root / "cache", root / "run")
    import platformdirs

    dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
    if sys.platform.startswith("linux") and not env.get("XDG_RUNTIME_DIR"):
        runtime = Path(dirs.user_state_dir) / "run"  # no login session folder (containers, ssh)
    else:
        runtime = Path(dirs.user_runtime_dir)
    return Paths(Path(dirs.user_config_dir), Path(dirs.user_data_dir), Path(dirs.user_cache_dir), runtime)


class ConfigError(ValueError):
    """config.toml or an override has a value the service cannot use."""


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any, *, name: str = "duration") -> float | None:
    """Seconds from ``300``, ``"5m"``, ``"1h"``, ``"30s"``; ``None`` for never (-1, "never")."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected seconds or a duration like '5m', got {value!r}")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    if isinstance(value, str):
        if value.strip().lower() in {"never", "forever", "-1"}:
            return None
        match = _DURATION.match(value)
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
            return None if seconds < 0 else seconds
    raise ConfigError(f"{name}: expected seconds or a duration like '5m', got {value!r}")


@dataclass
class Config:
    """User settings. Defaults suit a desktop; every field can be set in config.toml."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    models_dirs: list[Path] = field(default_factory=list)
    default_dirs: bool = True
    context_cap: int | None = None  # None: each model's window is sized from memory (up to its trained length)
    keep_alive: float | None = 300.0
    gpu: str = "auto"  # "auto" | "off"
    gpu_layers: int | None = None  # None: all layers that fit
    threads: int | None = None  # None: physical cores
    parallel: int | None = None  # sequences decoded together per model; None: from model and memory
    max_queue: int = 16  # waiting requests per model before 429
    speculative: bool = True  # speculative decoding from prompt lookup (exact; stops where it does not pay)
    prompt_cache_gib: float = 4.0  # disk for saved conversation states (restored after unload/restart); 0: off
    allocator: str = "auto"  # model processes' malloc: "auto" (jemalloc or tcmalloc where installed) | "system"
    max_loaded_models: int = 3
    memory_budget_fraction: float = 0.75  # of RAM (and VRAM) that loaded models may use
    max_request_bytes: int = 8 * 1024 * 1024
    request_head_timeout: float = 10.0  # a request line and headers must arrive within this
    request_body_timeout: float = 60.0  # a request body must arrive within this
    idle_timeout: float = 15.0  # a kept-alive connection with no request is closed after this
    max_connections: int = 4096  # open connections (kept below the descriptor limit)
    max_queued_tasks: int = 64  # a token's queued tasks before POST /tasks answers 429
    max_grammar_bytes: int = 512 * 1024  # GBNF a request's schemas and tools may compile to (else 400)
    event_retention: float = 86400.0  # a finished task's events (then 410 event_history_expired)
    stored_response_ttl: float | None = None  # stored responses (`store: true`); None: until deleted
    task_ttl: float | None = None  # finished tasks themselves; None: until deleted
    housekeeping_interval: float | None = None  # None: from event_retention (1 s .. 10 min)
    allowed_origins: list[str] = field(default_factory=list)
    demo_model: bool = True  # assemble the embedded demo model when no other model exists
    keyring_retry: float | None = 30.0  # after a keyring failure, try it again this often; None: never
    # Off by default: scopes granted to requests WITHOUT a valid token (apps that cannot send one),
    # e.g. ["models:read", "responses:create"]; only those in KEYLESS_ALLOWED. Every local process gets them.
    keyless_scopes: list[str] = field(default_factory=list)
    sse_keepalive: float = 15.0  # a silent event stream gets a keep-alive comment this often

    def with_overrides(self, **overrides: Any) -> Config:
        """A copy with the non-None overrides applied (command-line options)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **clean)


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_FINITE_DURATIONS = ("request_head_timeout", "request_body_timeout", "idle_timeout")


def load_config(paths: Paths) -> Config:
    """Read config.toml (if any); unknown keys are an error so typos do not go unnoticed."""
    path = paths.config_file
    if not path.exists():
        return Config()
    fix = "fix or remove it (every setting is optional)"
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder, not a settings file; {fix}") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); {fix}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        kind = "UTF-16 text" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "not UTF-8 text (perhaps a binary file)"
        raise ConfigError(f"{path} is {kind}; TOML settings must be UTF-8 text: save it as UTF-8, or {fix}") from None
    try:
        raw = tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); {fix}") from None
    return config_from_mapping(raw, source=str(path))


def config_from_mapping(raw: Mapping[str, Any], *, source: str = "config") -> Config:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in _FIELDS:
            raise ConfigError(f"{source}: unknown setting {key!r}{_did_you_mean(name)}")
        values[name] = _coerce(name, value, source)
    return Config(**values)


def _did_you_mean(name: str) -> str:
    """ "; did you mean 'models_dirs'?" for a near miss of a known setting, else a pointer to the list."""
    import difflib

    close = difflib.get_close_matches(name, list(_FIELDS), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return "; the settings are listed in README.md under 'Files and configuration'"


def _coerce(name: str, value: Any, source: str) -> Any:
    where = f"{source}: {name}"
    if name in {
        "keep_alive",
        "event_retention",
        "stored_response_ttl",
        "task_ttl",
        "housekeeping_interval",
        "keyring_retry",
        "sse_keepalive",
        *_FINITE_DURATIONS,
    }:
        seconds = parse_duration(value, name=where)
        if name in {"event_retention", "housekeeping_interval", "sse_keepalive"} and seconds is None:
            raise ConfigError(f"{where}: must be a finite duration")
        if name == "sse_keepalive" and seconds is not None and seconds <= 0:
            raise ConfigError(f"{where}: must be a duration above zero")
        if name in _FINITE_DURATIONS and not seconds:
            raise ConfigError(f"{where}: must be a positive, finite duration")
        return seconds
    if name == "models_dirs":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of folder paths")
        return [Path(v).expanduser() for v in value]
    if name == "allowed_origins":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of origins like 'http://localhost:3000'")
        return [v.rstrip("/") for v in value]
    if name == "keyless_scopes":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of scopes like ['models:read', 'responses:create']")
        for scope in value:
            if scope not in KEYLESS_ALLOWED:
                raise ConfigError(
                    f"{where}: {scope!r} cannot be granted without a token; choose from {', '.join(KEYLESS_ALLOWED)}"
                )
        return [s for s in KEYLESS_ALLOWED if s in value]
    if name == "gpu":
        if not isinstance(value, str) or value not in {"auto", "off"}:
            raise ConfigError(f"{where}: expected 'auto' or 'off'")
        return value
    if name == "allocator":
        if not isinstance(value, str) or value not in {"auto", "system"}:
            raise ConfigError(f"{where}: expected 'auto' or 'system'")
        return value
    if name in {"default_dirs", "demo_model", "speculative"}:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false")
        return value
    if name == "prompt_cache_gib":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}: expected a size in GiB (0 turns the prompt cache off)")
        return float(value)
    if name == "memory_budget_fraction":
        if not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ConfigError(f"{where}: expected a number in (0, 1]")
        return float(value)
    if name == "host":
        if not isinstance(value, str) or value not in {"127.0.0.1", "::1", "localhost"}:
            raise ConfigError(f"{where}: the service only binds loopback (127.0.0.1 or ::1)")
        return value
    if name in {"gpu_layers", "threads", "parallel", "context_cap"} and value is None:
        return None
    if name == "context_cap" and value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "gpu_layers" else 1):
        raise ConfigError(f"{where}: expected a positive whole number")
    if name == "port" and value > 65535:
        raise ConfigError(f"{where}: expected a port number up to 65535")
    return value
