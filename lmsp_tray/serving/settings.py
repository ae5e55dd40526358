"""The settings a person changes most, read and written for the console's Settings form.

Why here: the form edits `config.toml` and the running service at once.
Values are checked by config.toml's own schema (`config.config_from_mapping`:
the changes together, an error naming its field; then the whole file as it
will be written, so a file made worse is never saved), then written back with
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
from lmsp_tray.private import PRIVATE_FILE, write_private

START_AT_LOGIN = "start_at_login"


@dataclass(frozen=True)
class Field:
    """One field of the form: how to show it and whether a change needs a restart."""

    key: str
    label: str
    # "port" | "optional_port" (empty: off) | "folders" | "bool" | "duration" | "int" | "auto_int" | "choice"
    # | "scopes" (several choices)
    kind: str
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
        "ollama_port",
        "Ollama's port",
        "optional_port",
        "A second loopback port for apps fixed on Ollama's address (11434); used only when nothing else holds "
        "it. Empty: off.",
        "restart",
    ),
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
        "memory (32k tokens or more where one sequence fits, so a coding agent's first request fits).",
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
    Field(
        "metrics_keyless",
        "Metrics without a token",
        "bool",
        "Let Prometheus read /metrics without a token (counts and timings per model; no prompts or answers). "
        "Any program on this computer can then read them.",
        "now",
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
        self.lock = threading.Lock()  # one change of config.toml at a time (this form's, a model's settings)

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
                config_changes[key] = _as_written(key, value)
            else:
                raise InvalidRequest(f"'{str(key)[:40]}' is not a setting this form changes.", param=str(key)[:64])
        checked = _checked(config_changes)
        with self.lock:
            if config_changes:
                self._write(config_changes)
            if login_value is not None:
                try:
                    assert self.login_item is not None
                    self.login_item.set(login_value)
                except Exception as exc:  # noqa: BLE001 - the OS refused: say so, plainly
                    raise ServiceUnavailable(f"Could not change start at login: {exc}") from None
            applied = self._apply(config_changes, checked)
        doc = self.document()
        doc["applied"] = sorted(applied | ({START_AT_LOGIN} if login_value is not None else set()))
        return doc

    def _write(self, changes: Mapping[str, Any]) -> None:
        def change(doc: tomlkit.TOMLDocument) -> None:
            for key, value in changes.items():
                spelled = next((k for k in list(doc.keys()) if k.replace("-", "_") == key), key)
                if value is None:
                    if spelled in doc:
                        del doc[spelled]
                else:
                    doc[spelled] = value

        self.edit(change)

    def edit(self, change: Callable[[tomlkit.TOMLDocument], None]) -> Config:
        """config.toml changed by `change` (on its tomlkit document: comments, layout and other keys
        kept), checked whole by its own rules and written in one rename; the new file's `Config`.
        A file that does not parse, or that the change would leave invalid, is not touched (409).
        Callers outside `update` hold `lock`."""
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
        change(doc)
        new_text = tomlkit.dumps(doc)
        try:
            config = config_from_mapping(tomllib.loads(new_text), source=str(path))
        except (ConfigError, tomllib.TOMLDecodeError) as exc:
            raise Conflict(f"{exc}. Fix config.toml in a text editor; nothing was changed.") from None
        _write_atomic(path, new_text)
        return config

    def _apply(self, changes: Mapping[str, Any], checked: Config) -> set[str]:
        """Hands the changed values, as the service uses them (`checked`: the changes validated,
        defaults for the removed keys), to the `apply` hook; returns the keys applied."""
        live = [k for k in changes if next(f for f in FIELDS if f.key == k).applies != "restart"]
        if not live or self.apply is None:
            return set()
        self.apply({k: getattr(checked, k) for k in live})
        return set(live)


def _file_value(key: str, raw: Any) -> Any:
    """A value from the file as the form shows it: as written where that is clearer."""
    if key in ("models_dirs", "keep_alive") and (isinstance(raw, (str, list))):
        return list(raw) if isinstance(raw, list) else raw
    try:
        return shown(key, getattr(config_from_mapping({key: raw}, source="config.toml"), key))
    except ConfigError:
        return raw  # edited by hand since the start; the form shows it and refuses it on save


def _as_written(key: str, value: Any) -> Any:
    """A form value as config.toml will hold it: model folders trimmed, and none of them empty (the
    form's own rule: in the file an empty path would mean the current folder)."""
    if key == "models_dirs" and isinstance(value, list):
        value = [v.strip() if isinstance(v, str) else v for v in value]
        if any(v == "" for v in value):
            raise InvalidRequest("models_dirs: a folder path cannot be empty", param=key)
    return value


def _checked(changes: Mapping[str, Any]) -> Config:
    """The changes validated together by config.toml's rules (a null removes a key: its default),
    else 400 naming the first bad field."""
    try:
        return config_from_mapping({k: v for k, v in changes.items() if v is not None}, source="settings")
    except ConfigError as exc:
        raise InvalidRequest(exc.detail, param=exc.setting) from None


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename, keeping the file's permissions (0600 for a new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = PRIVATE_FILE  # private to the user, like everything the service keeps
    write_private(path, text, mode=mode)
