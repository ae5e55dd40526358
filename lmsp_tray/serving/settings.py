"""The settings a person changes most, read and written for the console's Settings form.

Why here: the form edits `config.toml` and the running service at once.
Values are checked by the same rules as at start (`config.config_from_mapping`,
one key at a time so an error names its field), then written back with
tomlkit, which keeps the file's comments, layout and every key the form does
not show; a file that cannot be parsed is never overwritten. What can change
live is applied through the `apply` hook the daemon passes (model folders and
keep-alive at once; context cap, parallel sequences, GPU use and the number
of loaded models from the next load); the port needs a restart, and the
document says so while the file and the running service disagree.

"Start at login" is not in `config.toml`: it is the desktop's own switch,
reached through a `LoginItem` the command line passes down (the desktop
layer's `Autostart`), absent when the service runs without one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tomlkit
import tomlkit.exceptions

from lmsp_tray.config import KEYLESS_ALLOWED, Config, ConfigError, Paths, config_from_mapping
from lmsp_tray.errors import Conflict, InvalidRequest, ServiceUnavailable

START_AT_LOGIN = "start_at_login"


@dataclass(frozen=True)
class Field:
    """One field of the form: how to show it and whether a change needs a restart."""

    key: str
    label: str
    kind: str  # "port" | "folders" | "bool" | "duration" | "int" | "auto_int" | "choice" | "scopes" (several choices)
    help: str
    applies: str  # "restart" | "now" | "next_load"
    choices: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "key": self.key,
            "label": self.label,
            "kind": self.kind,
            "help": self.help,
            "applies": self.applies,
        }
        if self.choices:
            doc["choices"] = list(self.choices)
        return doc


FIELDS: tuple[Field, ...] = (
    Field("port", "Port", "port", "The TCP port on 127.0.0.1 the service listens on.", "restart"),
    Field(
        "models_dirs",
        "Model folders",
        "folders",
        "Extra folders scanned for .gguf files, one per line (~ is your home folder).",
        "now",
    ),
    Field(
        "default_dirs",
        "Scan other apps' folders",
        "bool",
        "Also find models in LM Studio, Ollama, the Hugging Face and llama.cpp caches.",
        "now",
    ),
    Field(
        "keep_alive",
        "Keep models loaded",
        "duration",
        'How long an idle model stays loaded: seconds or "30s", "5m", "1h"; "never" keeps it loaded.',
        "now",
    ),
    Field(
        "context_cap",
        "Context cap (tokens)",
        "auto_int",
        "The context window is the model's trained length or this, whichever is smaller; empty: sized from "
        "memory (16k tokens or more where it fits, so a coding agent's first request fits).",
        "next_load",
    ),
    Field(
        "parallel",
        "Parallel sequences",
        "auto_int",
        "Requests decoded together per model; empty: chosen from the model and memory.",
        "next_load",
    ),
    Field(
        "max_loaded_models", "Models loaded at once", "int", "The least recently used idle one makes room.", "next_load"
    ),
    Field(
        "gpu",
        "GPU",
        "choice",
        '"auto" uses a GPU when llama.cpp has one; "off" forces the CPU.',
        "next_load",
        ("auto", "off"),
    ),
    Field(
        "keyless_scopes",
        "Apps without a token",
        "scopes",
        "For apps that cannot send a token: what every program on this computer may do without one. "
        "Leave all unticked unless an app needs it; prefer pairing.",
        "now",
        KEYLESS_ALLOWED,
    ),
)
FIELD_KEYS = frozenset(f.key for f in FIELDS)
_DEFAULTS = Config()


class LoginItem(Protocol):
    """Start at login (the desktop layer's `Autostart` has this shape)."""

    @property
    def supported(self) -> bool: ...
    def is_enabled(self) -> bool: ...
    def set(self, enabled: bool) -> Any: ...


def shown(key: str, value: Any) -> Any:
    """A value as the form shows it (folders as strings, durations as written, else as is)."""
    if key == "models_dirs":
        return [str(v) for v in value or []]
    if key == "keep_alive":
        if value is None:
            return "never"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
            for unit, size in (("h", 3600), ("m", 60)):
                if seconds >= size and seconds % size == 0:
                    return f"{int(seconds // size)}{unit}"
            return f"{seconds:g}s"
    return value


class Settings:
    """Reads, checks, writes and applies the form's settings. One update at a time."""

    def __init__(
        self,
        paths: Paths,
        running: Callable[[], Config],
        *,
        apply: Callable[[Mapping[str, Any]], None] | None = None,
        login_item: LoginItem | None = None,
    ) -> None:
        self.paths = paths
        self.running = running
        self.apply = apply
        self.login_item = login_item
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------------------
    def _file_values(self) -> dict[str, Any]:
        """The file's raw values (as written), {} when it does not exist."""
        try:
            text = self.paths.config_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ServiceUnavailable(f"Cannot read {self.paths.config_file}: {exc.strerror or exc}.") from None
        try:
            return {k.replace("-", "_"): v for k, v in tomllib.loads(text).items()}
        except tomllib.TOMLDecodeError as exc:
            raise Conflict(
                f"{self.paths.config_file} is not valid TOML ({exc}); fix it in a text editor first."
            ) from None

    def document(self) -> dict[str, Any]:
        """The form: fields, the file's values (defaults where unset), the running values, pending restarts."""
        raw = self._file_values()
        running = self.running()
        values: dict[str, Any] = {}
        live: dict[str, Any] = {}
        for f in FIELDS:
            values[f.key] = _file_value(f.key, raw[f.key]) if f.key in raw else shown(f.key, getattr(_DEFAULTS, f.key))
            live[f.key] = shown(f.key, getattr(running, f.key))
        fields = [f.to_json() for f in FIELDS]
        login = self.login_item
        if login is not None and login.supported:
            values[START_AT_LOGIN] = live[START_AT_LOGIN] = bool(login.is_enabled())
            fields.append(
                Field(START_AT_LOGIN, "Start at login", "bool", "Start lmsp-tray when you log in.", "now").to_json()
            )
        pending = [f.key for f in FIELDS if f.applies == "restart" and f.key in raw and values[f.key] != live[f.key]]
        return {
            "object": "settings",
            "config_file": str(self.paths.config_file),
            "fields": fields,
            "values": values,
            "running": live,
            "restart_required": pending,
        }

    # -- writing ------------------------------------------------------------------------------------
    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Check every change, write config.toml, apply what can be applied now; returns `document()`
        plus `applied` (keys in effect now or from the next load) and `restart_required`.

        A value of null removes the key from the file (its default applies). Blocking: file and
        desktop calls; run it off the event loop."""
        if not isinstance(changes, Mapping) or not changes:
            raise InvalidRequest('Send a JSON object of settings to change, e.g. {"keep_alive": "10m"}.')
        login_value = None
        config_changes: dict[str, Any] = {}
        for key, value in changes.items():
            if key == START_AT_LOGIN:
                if not isinstance(value, bool):
                    raise InvalidRequest("start_at_login: expected true or false", param=key)
                if self.login_item is None or not self.login_item.supported:
                    raise Conflict(
                        "Start at login cannot be changed here: this service runs without a desktop session "
                        "(or on a system without one). Use `lmsp-tray autostart enable|disable`.",
                        param=key,
                    )
                login_value = value
            elif key in FIELD_KEYS:
                config_changes[key] = check_value(key, value)
            else:
                raise InvalidRequest(f"'{str(key)[:40]}' is not a setting this form changes.", param=str(key)[:64])
        with self._lock:
            if config_changes:
                self._write(config_changes)
            if login_value is not None:
                try:
                    assert self.login_item is not None
                    self.login_item.set(login_value)
                except Exception as exc:  # noqa: BLE001 - the OS refused: say so, plainly
                    raise ServiceUnavailable(f"Could not change start at login: {exc}") from None
            applied = self._apply(config_changes)
        doc = self.document()
        doc["applied"] = sorted(applied | ({START_AT_LOGIN} if login_value is not None else set()))
        return doc

    def _write(self, changes: Mapping[str, Any]) -> None:
        path = self.paths.config_file
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            raise ServiceUnavailable(f"Cannot read {path}: {exc.strerror or exc}.") from None
        try:
            doc = tomlkit.parse(text)
        except tomlkit.exceptions.TOMLKitError as exc:
            raise Conflict(f"{path} is not valid TOML ({exc}); fix it in a text editor first.") from None
        for key, value in changes.items():
            spelled = next((k for k in list(doc.keys()) if k.replace("-", "_") == key), key)
            if value is None:
                if spelled in doc:
                    del doc[spelled]
            else:
                doc[spelled] = value
        new_text = tomlkit.dumps(doc)
        try:
            config_from_mapping(tomllib.loads(new_text), source=str(path))
        except (ConfigError, tomllib.TOMLDecodeError) as exc:
            raise Conflict(f"{exc}. Fix config.toml in a text editor; nothing was changed.") from None
        _write_atomic(path, new_text)

    def _apply(self, changes: Mapping[str, Any]) -> set[str]:
        live = {k: v for k, v in changes.items() if next(f for f in FIELDS if f.key == k).applies != "restart"}
        if not live or self.apply is None:
            return set()
        coerced = config_from_mapping({k: v for k, v in live.items() if v is not None}, source="settings")
        self.apply({k: getattr(coerced if live[k] is not None else _DEFAULTS, k) for k in live})
        return set(live)


def _file_value(key: str, raw: Any) -> Any:
    """A value from the file as the form shows it: as written where that is clearer."""
    if key in ("models_dirs", "keep_alive") and (isinstance(raw, (str, list))):
        return list(raw) if isinstance(raw, list) else raw
    try:
        return shown(key, getattr(config_from_mapping({key: raw}, source="config.toml"), key))
    except ConfigError:
        return raw  # edited by hand since the start; the form shows it and refuses it on save


def check_value(key: str, value: Any) -> Any:
    """`value` if config.toml may hold it for `key` (None: remove the key), else 400 naming the field."""
    if value is None:
        return None
    if key == "models_dirs" and isinstance(value, list):
        value = [v.strip() if isinstance(v, str) else v for v in value]
        if any(v == "" for v in value):
            raise InvalidRequest("models_dirs: a folder path cannot be empty", param=key)
    try:
        config_from_mapping({key: value}, source="settings")
    except ConfigError as exc:
        raise InvalidRequest(str(exc).removeprefix("settings: "), param=key) from None
    return value


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename, keeping the file's permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600  # private to the user, like everything the service keeps
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
