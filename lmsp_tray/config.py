"""Where lmsp-tray keeps its files, and the settings a user can change.

Paths come from platformdirs, or all sit under one folder when
``LMSP_TRAY_HOME`` is set (tests, portable installs). Settings come from
``config.toml`` in the config folder, then from command-line overrides.
Nothing is read at import time: the daemon calls `resolve_paths` and
`load_config` once and passes the results down.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

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
        """Saved KV states of conversations (`runner.prompt_cache`), restored after unload or restart."""
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
    """config.toml or an override has a value the service cannot use.

    `setting` names the offending setting (dotted, as in the file) when there is one, and `detail`
    is the message without the file's name in front (the settings form reports it per field)."""

    def __init__(self, message: str, *, setting: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.detail = detail or message


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def _seconds(value: Any) -> float | None:
    """Seconds from ``300``, ``"5m"``, ``"1h"``, ``"30s"``; ``None`` for never (-1, "never");
    raises `ValueError` saying what a duration looks like."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value < 0 else float(value)
    if isinstance(value, str):
        if value.strip().lower() in {"never", "forever", "-1"}:
            return None
        match = _DURATION.match(value)
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
            return None if seconds < 0 else seconds
    raise ValueError(f"expected seconds or a duration like '5m', got {value!r}")


def parse_duration(value: Any, *, name: str = "duration") -> float | None:
    """Seconds from ``300``, ``"5m"``, ``"1h"``, ``"30s"``; ``None`` for never (-1, "never")."""
    try:
        return _seconds(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


# -- the rules of config.toml ------------------------------------------------------------------------
# Each setting's type carries its rule (pydantic, strict where a TOML type is expected) and the one
# message a person reads when the value breaks it; `Config` below is validated by `SCHEMA`.


def _refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError("config", "{message}", {"message": message})


def _says(message: str) -> WrapValidator:
    """Any failure of the checks before this one is reported as `message` (the config's words,
    not pydantic's); a message of a check of our own passes through."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise _refuse(first["msg"] if first["type"] == "config" else message) from None

    return WrapValidator(validate)


def _check(ok: Callable[[Any], bool], message: str) -> AfterValidator:
    """A check on the validated value."""

    def validate(value: Any) -> Any:
        if not ok(value):
            raise _refuse(message)
        return value

    return AfterValidator(validate)


def _duration(value: Any) -> float | None:
    try:
        return _seconds(value)
    except ValueError as exc:
        raise _refuse(str(exc)) from None


def _grantable(scopes: list[str]) -> list[str]:
    for scope in scopes:
        if scope not in KEYLESS_ALLOWED:
            raise _refuse(f"{scope!r} cannot be granted without a token; choose from {', '.join(KEYLESS_ALLOWED)}")
    return [s for s in KEYLESS_ALLOWED if s in scopes]


_WHOLE = "expected a positive whole number"
Whole = Annotated[int, Strict(), Field(ge=1), _says(_WHOLE)]
Port = Annotated[
    int, Strict(), Field(ge=1), _says(_WHOLE), _check(lambda port: port <= 65535, "expected a port number up to 65535")
]
OptionalPort = Annotated[
    Annotated[int, Strict(), Field(ge=1)] | None,
    _says(_WHOLE),
    _check(lambda port: port is None or port <= 65535, "expected a port number up to 65535"),
]
OptionalWhole = Annotated[Annotated[int, Strict(), Field(ge=1)] | None, _says(_WHOLE)]
Layers = Annotated[Annotated[int, Strict(), Field(ge=0)] | None, _says(_WHOLE)]
ContextCap = Annotated[
    Annotated[int, Strict(), Field(ge=1)] | None, BeforeValidator(lambda v: None if v == "auto" else v), _says(_WHOLE)
]
Switch = Annotated[bool, Strict(), _says("expected true or false")]
Duration = Annotated[float | None, PlainValidator(_duration)]  # None: never
_FINITE = _check(lambda seconds: seconds is not None, "must be a finite duration")
FiniteDuration = Annotated[float, PlainValidator(_duration), _FINITE]
FiniteOrUnset = Annotated[float | None, PlainValidator(_duration), _FINITE]  # None only as a default, never written
PositiveDuration = Annotated[
    float, PlainValidator(_duration), _FINITE, _check(lambda s: s > 0, "must be a duration above zero")
]
Timeout = Annotated[float, PlainValidator(_duration), _check(lambda s: bool(s), "must be a positive, finite duration")]
Folders = Annotated[
    list[Path],
    Strict(),
    _says("expected a list of folder paths"),
    AfterValidator(lambda ps: [p.expanduser() for p in ps]),
]
Origins = Annotated[
    list[Annotated[str, Strict()]],
    Strict(),
    _says("expected a list of origins like 'http://localhost:3000'"),
    AfterValidator(lambda origins: [o.rstrip("/") for o in origins]),
]
Scopes = Annotated[
    list[Annotated[str, Strict()]],
    Strict(),
    _says("expected a list of scopes like ['models:read', 'responses:create']"),
    AfterValidator(_grantable),
]
Loopback = Annotated[
    Literal["127.0.0.1", "::1", "localhost"], _says("the service only binds loopback (127.0.0.1 or ::1)")
]
Aliases = Annotated[
    dict[Annotated[str, Strict()], Annotated[str, Strict()]],
    Strict(),
    _says('expected a table of names to model ids, like "claude-sonnet-4-5" = "<model id>"'),
]
GpuUse = Annotated[Literal["auto", "off"], _says("expected 'auto' or 'off'")]
AllocatorChoice = Annotated[Literal["auto", "system"], _says("expected 'auto' or 'system'")]
GiB = Annotated[float, Strict(), Field(ge=0), _says("expected a size in GiB (0 turns the prompt cache off)")]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1), _says("expected a number in (0, 1]")]


def _keep_alive_or_never(value: Any) -> float:
    """A model's own keep-alive: seconds, `math.inf` for never (None stays free to mean "not set")."""
    seconds = _duration(value)
    return math.inf if seconds is None else seconds


ModelKeepAlive = Annotated[float | None, PlainValidator(_keep_alive_or_never)]  # inf: never
OptionalSwitch = Annotated[Annotated[bool, Strict()] | None, _says("expected true or false")]
Temperature = Annotated[
    Annotated[float, Strict(), Field(ge=0, le=2)] | None, _says("expected a number from 0 to 2 (0: greedy)")
]
TopK = Annotated[
    Annotated[int, Strict(), Field(ge=0, le=2**31 - 1)] | None, _says("expected a whole number, 0 or more (0: off)")
]
UnitInterval = Annotated[Annotated[float, Strict(), Field(ge=0, le=1)] | None, _says("expected a number from 0 to 1")]
RepeatPenalty = Annotated[
    Annotated[float, Strict(), Field(gt=0, le=10)] | None, _says("expected a number above 0, up to 10 (1: off)")
]
Text = Annotated[Annotated[str, Strict()] | None, _says("expected a string")]
ModelId = Annotated[
    Annotated[str, Strict(), Field(min_length=1)] | None, _says("expected a model id (a non-empty string)")
]

# Every table of settings (this one, and nested ones to come) spells keys with - or _ alike,
# refuses keys it does not know, and names a field by its own name in errors.
TABLE = ConfigDict(
    extra="forbid", alias_generator=lambda name: name.replace("_", "-"), populate_by_name=True, loc_by_alias=False
)


@dataclass(frozen=True)
class ModelSettings:
    """One model's own settings (``[models."<id>"]`` in config.toml); each unset one (None) is the
    service-wide setting or the built-in default. The load settings apply at the model's next load,
    the sampling defaults and system prompt to each request that does not set its own."""

    __pydantic_config__ = TABLE

    context: OptionalWhole = None  # the window cap for this model (as `context_cap`)
    keep_alive: ModelKeepAlive = None  # seconds idle before unloading; math.inf: never
    parallel: OptionalWhole = None
    gpu_layers: Layers = None
    speculative: OptionalSwitch = None
    temperature: Temperature = None
    top_k: TopK = None
    top_p: UnitInterval = None
    min_p: UnitInterval = None
    repeat_penalty: RepeatPenalty = None
    system_prompt: Text = None  # a system message for requests that send none
    draft: ModelId = None  # a smaller model of the same vocabulary that drafts for this one (from its next load)


MODEL_SETTING_KEYS = tuple(f.name for f in dataclasses.fields(ModelSettings))


def _tables(value: Any) -> Any:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise _refuse('expected tables of settings per model, like [models."<model id>"] with context = 8192')
    return value


ModelTables = Annotated[dict[str, ModelSettings], BeforeValidator(_tables)]


@dataclass
class Config:
    """User settings. Defaults suit a desktop; every field can be set in config.toml."""

    __pydantic_config__ = TABLE

    host: Loopback = "127.0.0.1"
    port: Port = DEFAULT_PORT
    models_dirs: Folders = field(default_factory=list)
    default_dirs: Switch = True
    context_cap: ContextCap = None  # None: each model's window is sized from memory (up to its trained length)
    keep_alive: Duration = 300.0
    gpu: GpuUse = "auto"  # "auto" | "off"
    gpu_layers: Layers = None  # None: all layers that fit
    threads: OptionalWhole = None  # None: physical cores
    parallel: OptionalWhole = None  # sequences decoded together per model; None: from model and memory
    max_queue: Whole = 16  # waiting requests per model before 429
    speculative: Switch = True  # speculative decoding from prompt lookup (exact; stops where it does not pay)
    prompt_cache_gib: GiB = 4.0  # disk for saved conversation states (restored after unload/restart); 0: off
    # model processes' malloc: "auto" (jemalloc or tcmalloc where installed) | "system"
    allocator: AllocatorChoice = "auto"
    max_loaded_models: Whole = 3
    memory_budget_fraction: Fraction = 0.75  # of RAM (and VRAM) that loaded models may use
    max_request_bytes: Whole = 8 * 1024 * 1024
    request_head_timeout: Timeout = 10.0  # a request line and headers must arrive within this
    request_body_timeout: Timeout = 60.0  # a request body must arrive within this
    idle_timeout: Timeout = 15.0  # a kept-alive connection with no request is closed after this
    max_connections: Whole = 4096  # open connections (kept below the descriptor limit)
    max_queued_tasks: Whole = 64  # a token's queued tasks before POST /tasks answers 429
    max_grammar_bytes: Whole = 512 * 1024  # GBNF a request's schemas and tools may compile to (else 400)
    event_retention: FiniteDuration = 86400.0  # a finished task's events (then 410 event_history_expired)
    stored_response_ttl: Duration = None  # stored responses (`store: true`); None: until deleted
    task_ttl: Duration = None  # finished tasks themselves; None: until deleted
    housekeeping_interval: FiniteOrUnset = None  # None: from event_retention (1 s .. 10 min)
    allowed_origins: Origins = field(default_factory=list)
    demo_model: Switch = True  # assemble the embedded demo model when no other model exists
    keyring_retry: Duration = 30.0  # after a keyring failure, try it again this often; None: never
    # Off by default: scopes granted to requests WITHOUT a valid token (apps that cannot send one),
    # e.g. ["models:read", "responses:create"]; only those in KEYLESS_ALLOWED. Every local process gets them.
    keyless_scopes: Scopes = field(default_factory=list)
    # Off by default: Prometheus (or any local process) may scrape GET /metrics without a token; it reads
    # counts and model names only, never requests' contents. Otherwise /metrics needs `activity:read`.
    metrics_keyless: Switch = False
    sse_keepalive: PositiveDuration = 15.0  # a silent event stream gets a keep-alive comment this often
    # [model_aliases]: names apps ask for mapped to local model ids, e.g. "claude-sonnet-4-5" = "gemma-3:270m-q4_k_m"
    model_aliases: Aliases = field(default_factory=dict)
    ollama_port: OptionalPort = None  # a second loopback listener for Ollama's apps (e.g. 11434); None: off
    # [models."<id>"]: one model's own settings (`ModelSettings`), keyed by model id
    models: ModelTables = field(default_factory=dict)

    def with_overrides(self, **overrides: Any) -> Config:
        """A copy with the non-None overrides applied (command-line options)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **clean)


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


SCHEMA: TypeAdapter[Config] = TypeAdapter(Config)


def config_from_mapping(raw: Mapping[str, Any], *, source: str = "config") -> Config:
    """`Config` from config.toml's table (or the settings form's changes); the first setting that
    breaks its rule, in the order written, is a `ConfigError` naming it."""
    try:
        return SCHEMA.validate_python(dict(raw))
    except ValidationError as exc:
        written = {name: i for i, key in enumerate(raw) for name in (key, key.replace("-", "_"))}
        first = min(exc.errors(), key=lambda e: written.get(str(e["loc"][0]), len(raw)) if e["loc"] else len(raw))
        raise _config_error(first, source) from None


def _config_error(error: ErrorDetails, source: str) -> ConfigError:
    head, *rest = error["loc"] or ("",)
    where = ".".join([str(head), *(_toml_key(part) for part in rest)])
    if error["type"] != "unexpected_keyword_argument":
        detail = f"{where}: {error['msg']}"
    else:
        known = [f.name for f in dataclasses.fields(Config if not rest else ModelSettings)]
        hint = _did_you_mean(str(error["loc"][-1]).replace("-", "_"), known) if len(rest) in (0, 2) else ""
        detail = f"unknown setting {where!r}{hint}"
    return ConfigError(f"{source}: {detail}", setting=where, detail=detail)


def _toml_key(part: str | int) -> str:
    """One part of a dotted key as TOML writes it: bare where it can be, else quoted."""
    text = str(part)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else json.dumps(text)


def _did_you_mean(name: str, known: list[str]) -> str:
    """ "; did you mean 'models_dirs'?" for a near miss of a known setting, else a pointer to the list."""
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return "; the settings are listed in docs/configuration.md"
