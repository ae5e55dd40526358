"""The tray menu as a pure function of the service's state.

Everything the tray shows is decided here, with no GUI toolkit imported:
`build_menu(TrayState) -> list[MenuItemSpec]`. `lmsp_tray.desktop.tray` turns the
specs into pystray items and routes each item's `Action` to a `TrayBackend`
call. Keeping the decisions here makes the menu unit-testable without a
display, and keeps the GUI layer a thin, mechanical translation.

Texts that come from outside (model ids, error reasons, the names that
pairing apps give themselves) are cleaned before they reach the menu; a line
that must be shortened is cut at a word boundary (never inside a path), and
the whole text is then one level down, wrapped, in a submenu. The access
token never reaches the menu.
"""

from __future__ import annotations

import enum
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from lmsp_tray.protocol.states import ModelState

# Activities: what the icon shows. Idle: no model in memory; ready: a model loaded, waiting.
IDLE = "idle"
READY = "ready"
LOADING = "loading"
SERVING = "serving"
ERROR = "error"
ACTIVITIES = (IDLE, READY, LOADING, SERVING, ERROR)

# Model states, as in the LMSP model object (PROFILE §3).
AVAILABLE = ModelState.AVAILABLE
MODEL_LOADING = ModelState.LOADING
LOADED = ModelState.LOADED
UNLOADING = ModelState.UNLOADING
MODEL_ERROR = ModelState.ERROR
MODEL_STATES = (AVAILABLE, MODEL_LOADING, LOADED, UNLOADING, MODEL_ERROR)

ERROR_MARK = "\u26a0"  # ⚠
ELLIPSIS = "\u2026"  # …
MAX_ERROR_CHARS = 70
MAX_NAME_CHARS = 40
WRAP_CHARS = 72  # the width of the lines that show a whole text in a submenu
MAX_MODELS_SHOWN = 100  # a huge Hugging Face cache must not make a screen-high menu unusable


class Action(str, enum.Enum):
    """What clicking a menu item asks for; `MenuItemSpec.arg` carries the target."""

    COPY_URL = "copy_url"
    OPEN_CONSOLE = "open_console"  # the console page in the browser
    LOAD_MODEL = "load_model"  # arg: model id
    UNLOAD_MODEL = "unload_model"  # arg: model id
    UNLOAD_ALL = "unload_all"
    RESCAN = "rescan"
    OPEN_MODELS_FOLDER = "open_models_folder"
    COPY_TOKEN = "copy_token"
    SET_AUTOSTART = "set_autostart"  # arg: "on" | "off" (the value to set, not a toggle)
    APPROVE_PAIRING = "approve_pairing"  # arg: pairing id
    DENY_PAIRING = "deny_pairing"  # arg: pairing id, or ALL_PAIRINGS
    CANCEL_DOWNLOAD = "cancel_download"  # arg: the download's task id
    VIEW_LOGS = "view_logs"
    SHOW_STATUS = "show_status"  # a notification with the state (icons without a menu)
    SET_OLLAMA_PORT = "set_ollama_port"  # arg: "on" | "off" (the value to set, not a toggle)
    QUIT = "quit"


@dataclass(frozen=True)
class ModelView:
    """One discovered model as the tray shows it."""

    id: str
    size_bytes: int | None = None
    quantization: str | None = None
    state: ModelState = AVAILABLE
    error: str | None = None  # the reason, when state is "error"
    generating: bool = False  # a response is being generated on it now
    file_name: str | None = None  # the file it is read from (shown beside the id)


@dataclass(frozen=True)
class ProblemFile:
    """A file in a models folder that is not (or not yet) a usable model: listed apart, not counted."""

    file_name: str
    reason: str
    folder: str = ""  # shown with "~" for the home folder
    incomplete: bool = False  # still being written, or cut short


ALL_PAIRINGS = "*"  # DENY_PAIRING's argument for every pending request


@dataclass(frozen=True)
class PairingView:
    """A pending request from a local app for a token; the user approves or denies it."""

    id: str
    app_name: str
    scopes: tuple[str, ...] = ()
    user_code: str = ""


@dataclass(frozen=True)
class DownloadView:
    """A model download in progress (`POST /models/pull`), as the tray shows it."""

    task_id: str
    name: str  # the model as named: hf.co/org/repo:Q4_K_M
    bytes_done: int = 0
    bytes_total: int = 0
    bytes_per_second: float | None = None
    eta_seconds: int | None = None
    queued: bool = False  # waiting to start or resume


@dataclass(frozen=True)
class OllamaPortView:
    """The opt-in second listener for Ollama's apps (`ollama_port`): what config.toml asks for and what
    runs now (the listener opens at the service's start, so a change waits for a restart)."""

    port: int  # the port config.toml names, else Ollama's own (11434)
    wanted: bool  # `ollama_port` is set in config.toml
    listening: bool  # the second listener runs now
    taken: bool = False  # it was asked for at this start, but another program (Ollama?) holds the port


@dataclass(frozen=True)
class TrayState:
    """Everything the menu and icon depend on. Equal states give equal menus."""

    url: str | None = None  # None while the server is not listening
    activity: str = IDLE  # one of ACTIVITIES; see `activity_for`
    models: tuple[ModelView, ...] = ()
    autostart_enabled: bool = False
    autostart_supported: bool = True
    pairings: tuple[PairingView, ...] = ()
    token_available: bool = False
    notice: str | None = None  # a service-level problem or the last failed action, shown on top (whole)
    problems: tuple[ProblemFile, ...] = ()  # files that are not usable models
    token_session_only: bool = False  # the owner token dies with this run (no keyring to keep it)
    models_folder: str | None = None  # the service's own models folder, for the "no models" hint
    downloads: tuple[DownloadView, ...] = ()
    compute: str | None = (
        None  # where models run: llama.cpp's backend and device ("Vulkan \u00b7 AMD Radeon 780M, 8.0 GB")
    )
    ollama: OllamaPortView | None = None  # None: the backend has no second listener to offer

    def __post_init__(self) -> None:
        # Accept lists from callers but keep the state hashable and comparable.
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "pairings", tuple(self.pairings))
        object.__setattr__(self, "problems", tuple(self.problems))
        object.__setattr__(self, "downloads", tuple(self.downloads))

    @property
    def loaded_count(self) -> int:
        return sum(1 for m in self.models if m.state == LOADED)


@dataclass(frozen=True)
class MenuItemSpec:
    """One menu entry, toolkit-neutral. A separator has only `separator=True`."""

    text: str = ""
    action: Action | None = None
    arg: str | None = None
    checked: bool | None = None  # None: not a check item
    enabled: bool = True
    submenu: tuple[MenuItemSpec, ...] | None = None
    separator: bool = False
    default: bool = False  # the action of a plain click on the icon, where the platform has one

    def find(self, text_prefix: str) -> MenuItemSpec:
        """The submenu entry whose text starts with `text_prefix` (for tests and tools)."""
        return find_item(self.submenu or (), text_prefix)


SEPARATOR = MenuItemSpec(separator=True)


def find_item(items: list[MenuItemSpec] | tuple[MenuItemSpec, ...], text_prefix: str) -> MenuItemSpec:
    for item in items:
        if not item.separator and item.text.startswith(text_prefix):
            return item
    raise KeyError(text_prefix)


# -- text helpers ---------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")
_SPACES = re.compile(r"\s+")


_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\)|^\s*Traceback:", re.MULTILINE)


def one_line(text: object) -> str:
    """Control and bidi characters removed, runs of spaces (and line breaks) made one space; a
    Python traceback that slipped into a message is left out (people get the message, not that)."""
    value = str(text)
    found = _TRACEBACK.search(value)
    if found:
        value = value[: found.start()]
    return _SPACES.sub(" ", _CONTROL.sub(" ", value)).strip()


def _pathlike(word: str) -> bool:
    return "/" in word or "\\" in word


def shorten(text: str, limit: int) -> str:
    """`text` (one line) in at most about `limit` characters, cut at a word boundary with "…".

    Never cuts inside a word; a path that starts the text and is longer than `limit` keeps its
    last components ("…/models/broken.gguf") rather than being cut in the middle of a name.
    """
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, max(limit, 2))
    if cut > 0:
        head = text[:cut].rstrip(" ,;:.(\u2014-")
        if head:
            return head + ELLIPSIS
    first = text.split(" ", 1)[0]
    if _pathlike(first):
        parts = re.split(r"(?=[/\\])", first)
        tail = ""
        for part in reversed(parts):
            if len(tail) + len(part) + 1 > limit and tail:
                break
            tail = part + tail
        return ELLIPSIS + tail
    return first[: max(limit - 1, 1)] + ELLIPSIS


def clean_text(text: object, limit: int) -> str:
    """One line of at most about `limit` characters, cut at a word boundary (see `shorten`)."""
    return shorten(one_line(text), limit)


def short_reason(reason: object, limit: int = MAX_ERROR_CHARS) -> str:
    """The first non-empty line of an error reason, cleaned and cut at a word boundary."""
    lines = [line for line in str(reason or "").splitlines() if line.strip()]
    return clean_text(lines[0], limit) if lines else "unknown error"


def full_reason(reason: object) -> str:
    """The whole reason as one line (for notifications, logs and wrapped submenus)."""
    return one_line(reason) or "unknown error"


def wrapped(text: object, width: int = WRAP_CHARS) -> list[str]:
    """The whole text as lines of about `width` characters, broken only between words."""
    return textwrap.wrap(one_line(text), width, break_long_words=False, break_on_hyphens=False) or [""]


def detail_items(text: object) -> tuple[MenuItemSpec, ...]:
    """A submenu that shows a whole text, one disabled line per wrapped line."""
    return tuple(MenuItemSpec(line, enabled=False) for line in wrapped(text))


def human_size(size_bytes: int | None) -> str:
    """Decimal units as model sites print them: 512 B, 8.4 KB, 253 MB, 4.9 GB."""
    if size_bytes is None or size_bytes < 0:
        return ""
    if size_bytes < 1000:
        return f"{size_bytes} B"
    value = float(size_bytes)
    for unit in ("KB", "MB", "GB", "TB", "PB"):
        value /= 1000.0
        if value < 999.5 or unit == "PB":
            break
    if value < 9.95:
        return f"{value:.1f} {unit}"
    return f"{value:.0f} {unit}"


def display_path(path: Path) -> str:
    """`path` with the home folder written as ~."""
    try:
        return "~/" + str(path.resolve().relative_to(Path.home().resolve()))
    except (ValueError, RuntimeError, OSError):
        return str(path)


def activity_for(models: tuple[ModelView, ...] | list[ModelView], *, failed: bool = False) -> str:
    """The icon state: error (a failed action), loading, serving, ready (a model loaded), else idle.

    A file that cannot be used is listed apart in the menu; it does not turn
    the icon red, or one stray broken file would keep it red forever.
    """
    if failed:
        return ERROR
    if any(m.state in (MODEL_LOADING, UNLOADING) for m in models):
        return LOADING
    if any(m.generating for m in models):
        return SERVING
    if any(m.state == LOADED for m in models):
        return READY
    return IDLE


_URGENCY = {IDLE: 0, READY: 1, SERVING: 2, LOADING: 3, ERROR: 4}


def most_urgent(*activities: str) -> str:
    """The activity the icon should show when several apply (error > loading > serving > ready > idle)."""
    return max(activities, key=lambda a: _URGENCY.get(a, 0), default=IDLE)


def tooltip(state: TrayState) -> str:
    """The icon's hover text: name, what it is doing, where it listens."""
    loaded = state.loaded_count
    if state.notice:
        doing = f"{ERROR_MARK} {clean_text(state.notice, MAX_ERROR_CHARS)}"
    elif state.activity == LOADING:
        doing = f"loading a model{ELLIPSIS}"
    elif state.activity == SERVING:
        doing = "generating"
    elif loaded:
        doing = f"{loaded} model{'s' if loaded != 1 else ''} loaded"
    else:
        doing = "ready"
    where = state.url or f"starting{ELLIPSIS}"
    return f"lmsp-tray \u2014 {doing} \u2014 {where}"


def status_line(state: TrayState) -> str:
    """The first menu line: the URL and how many models are loaded."""
    total = len(state.models)
    loaded = state.loaded_count
    count = f"{loaded} of {total} model{'s' if total != 1 else ''} loaded" if total else "no models found"
    if state.url is None:
        return f"Not serving yet \u2014 {count}"
    return f"{state.url} \u2014 {count}"


def compute_line(state: TrayState) -> str | None:
    """The menu's line under the status: the backend and device the models run on."""
    return f"Runs on {clean_text(state.compute, 90)}" if state.compute else None


def ollama_item(view: OllamaPortView) -> MenuItemSpec:
    """A check item for Ollama's port: checked while config.toml asks for it; the label says whether it
    is listening now, waits for a restart, or found the port taken."""
    if view.wanted and view.listening:
        how = "on"
    elif view.wanted and view.taken:
        how = "taken by another program"
    elif view.wanted:
        how = "on after a restart"
    elif view.listening:
        how = "off after a restart"
    else:
        how = "off"
    return MenuItemSpec(
        f"Ollama's port {view.port}: {how}", Action.SET_OLLAMA_PORT, "off" if view.wanted else "on", checked=view.wanted
    )


def model_label(model: ModelView) -> str:
    """`id · 253 MB · Q4_K_M · file.gguf`, then what is happening to it."""
    parts = [clean_text(model.id, 80)]
    size = human_size(model.size_bytes)
    if size:
        parts.append(size)
    if model.quantization:
        parts.append(clean_text(model.quantization, 16))
    if model.file_name:
        parts.append(clean_text(model.file_name, 60))
    label = " \u00b7 ".join(parts)
    if model.state == MODEL_LOADING:
        return f"{label} \u2014 Loading{ELLIPSIS}"
    if model.state == UNLOADING:
        return f"{label} \u2014 Unloading{ELLIPSIS}"
    if model.state == MODEL_ERROR:
        return f"{label} \u2014 {ERROR_MARK} could not load"
    if model.state == LOADED and model.generating:
        return f"{label} \u2014 generating"
    return label


def model_item(model: ModelView) -> MenuItemSpec:
    """Loaded: checked, click unloads. Available: click loads. Busy: disabled.

    A model that failed to load opens a submenu with the whole reason and "Try again".
    """
    label = model_label(model)
    if model.state == LOADED:
        return MenuItemSpec(label, Action.UNLOAD_MODEL, model.id, checked=True)
    if model.state in (MODEL_LOADING, UNLOADING):
        return MenuItemSpec(label, None, model.id, checked=model.state == UNLOADING, enabled=False)
    if model.state == MODEL_ERROR:
        return MenuItemSpec(
            label,
            submenu=(
                *detail_items(model.error or "unknown error"),
                SEPARATOR,
                MenuItemSpec("Try again", Action.LOAD_MODEL, model.id),
            ),
        )
    return MenuItemSpec(label, Action.LOAD_MODEL, model.id, checked=False)


def problem_item(problem: ProblemFile) -> MenuItemSpec:
    """`name.gguf — incomplete` with the whole reason and the folder one level down."""
    what = "incomplete" if problem.incomplete else "not usable"
    details = list(detail_items(problem.reason))
    if problem.folder:
        details += [SEPARATOR, *detail_items(f"In {problem.folder}")]
    return MenuItemSpec(f"{clean_text(problem.file_name, 60)} \u2014 {what}", submenu=tuple(details))


def pairing_item(pairing: PairingView) -> MenuItemSpec:
    """A submenu per request: who asks, for what, the code to compare, then Approve / Deny."""
    name = clean_text(pairing.app_name or "unnamed app", MAX_NAME_CHARS)
    code = clean_text(pairing.user_code, 24)
    scopes = ", ".join(clean_text(s, 32) for s in pairing.scopes) or "no scopes"
    title = f"\u201c{name}\u201d \u2014 code {code}" if code else f"\u201c{name}\u201d"
    return MenuItemSpec(
        title,
        submenu=(
            MenuItemSpec(f"App: {name}", enabled=False),
            MenuItemSpec(f"Code: {code or '(none)'}", enabled=False),
            MenuItemSpec(f"Scopes: {clean_text(scopes, 120)}", enabled=False),
            SEPARATOR,
            MenuItemSpec("Approve", Action.APPROVE_PAIRING, pairing.id),
            MenuItemSpec("Deny", Action.DENY_PAIRING, pairing.id),
        ),
    )


def models_submenu(state: TrayState) -> tuple[MenuItemSpec, ...]:
    items: list[MenuItemSpec] = []
    if not state.models:
        items.append(MenuItemSpec("No models yet", enabled=False))
        where = state.models_folder or "the models folder (Open models folder)"
        items.extend(detail_items(f"Put .gguf files in {where}; they show up here by themselves."))
        items.extend(detail_items("Models of LM Studio, Ollama, Hugging Face and llama.cpp are found too."))
    for model in state.models[:MAX_MODELS_SHOWN]:
        items.append(model_item(model))
    hidden = len(state.models) - MAX_MODELS_SHOWN
    if hidden > 0:
        items.append(MenuItemSpec(f"{hidden} more not shown (see GET /models)", enabled=False))
    return tuple(items)


def _duration(seconds: int) -> str:
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    if seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def download_label(download: DownloadView) -> str:
    """`hf.co/org/repo:Q4_K_M — 45% · 35 MB/s · 2 min left` (or queued)."""
    name = clean_text(download.name, MAX_NAME_CHARS + 20)
    if download.queued:
        return f"{name} \u2014 queued"
    share = download.bytes_done * 100 // download.bytes_total if download.bytes_total else 0
    parts = [f"{share}%"]
    if download.bytes_per_second:
        parts.append(f"{human_size(int(download.bytes_per_second))}/s")
    if download.eta_seconds:
        parts.append(f"{_duration(download.eta_seconds)} left")
    return f"{name} \u2014 " + " \u00b7 ".join(parts)


def downloads_section(state: TrayState) -> list[MenuItemSpec]:
    """One line per download in progress, each with its Cancel (the part fetched stays in the cache)."""
    if not state.downloads:
        return []
    count = len(state.downloads)
    return [
        SEPARATOR,
        MenuItemSpec(f"Downloading ({count})" if count > 1 else "Downloading", enabled=False),
        *(
            MenuItemSpec(
                download_label(d), submenu=(MenuItemSpec("Cancel download", Action.CANCEL_DOWNLOAD, d.task_id),)
            )
            for d in state.downloads
        ),
    ]


def notice_item(notice: str) -> MenuItemSpec:
    """The notice on top: one line, and the whole text one level down when the line had to be cut."""
    line = f"{ERROR_MARK} {clean_text(notice, MAX_ERROR_CHARS)}"
    if one_line(notice) == line[2:]:
        return MenuItemSpec(line, enabled=False)
    return MenuItemSpec(line, submenu=detail_items(notice))


def build_menu(state: TrayState) -> list[MenuItemSpec]:
    """The whole tray menu for `state`."""
    any_loaded = any(m.state in (LOADED, MODEL_LOADING) for m in state.models)
    loaded, total = state.loaded_count, len(state.models)
    items: list[MenuItemSpec] = [MenuItemSpec(status_line(state), Action.COPY_URL, enabled=state.url is not None)]
    compute = compute_line(state)
    if compute:
        items.append(MenuItemSpec(compute, enabled=False))
    if state.notice:
        items.append(notice_item(state.notice))
    items.append(MenuItemSpec("Open lmsp-tray", Action.OPEN_CONSOLE, enabled=state.url is not None, default=True))
    items.append(SEPARATOR)
    items.append(
        MenuItemSpec(f"Models ({loaded}/{total} loaded)" if total else "Models", submenu=models_submenu(state))
    )
    if state.problems:
        shown = state.problems[:MAX_MODELS_SHOWN]
        items.append(
            MenuItemSpec(f"Files that are not usable ({len(state.problems)})", submenu=tuple(map(problem_item, shown)))
        )
    items.append(MenuItemSpec("Unload all", Action.UNLOAD_ALL, enabled=any_loaded))
    items.append(MenuItemSpec("Rescan models", Action.RESCAN))
    items.append(MenuItemSpec("Open models folder", Action.OPEN_MODELS_FOLDER))
    items.extend(downloads_section(state))
    if state.pairings:
        items.append(SEPARATOR)
        count = len(state.pairings)
        items.append(MenuItemSpec(f"Pairing request{'s' if count != 1 else ''} ({count})", enabled=False))
        items.extend(pairing_item(p) for p in state.pairings)
        if count > 1:  # a flood of requests is dismissed in one action
            items.append(MenuItemSpec(f"Deny all {count} requests", Action.DENY_PAIRING, ALL_PAIRINGS))
    items.append(SEPARATOR)
    items.append(MenuItemSpec("Copy access token", Action.COPY_TOKEN, enabled=state.token_available))
    items.append(
        MenuItemSpec(
            "Start at login",
            Action.SET_AUTOSTART,
            "off" if state.autostart_enabled else "on",
            checked=state.autostart_enabled,
            enabled=state.autostart_supported,
        )
    )
    if state.ollama is not None:
        items.append(ollama_item(state.ollama))
    items.append(MenuItemSpec("View logs", Action.VIEW_LOGS))
    items.append(SEPARATOR)
    items.append(MenuItemSpec("Quit", Action.QUIT))
    return items


def status_text(state: TrayState) -> str:
    """The state in a few lines: the body of the notification an icon without a menu shows on a click."""
    lines = [status_line(state)]
    compute = compute_line(state)
    if compute:
        lines.append(compute)
    lines += [f"\u2713 {m.id}" for m in state.models if m.state == LOADED]
    if state.problems:
        lines.append(f"{len(state.problems)} file(s) in the models folders are not usable")
    if state.notice:
        lines.append(f"{ERROR_MARK} {full_reason(state.notice)}")
    return "\n".join(lines)


def walk(items: list[MenuItemSpec] | tuple[MenuItemSpec, ...]):
    """Every item, depth first (submenus after their parent)."""
    for item in items:
        yield item
        if item.submenu:
            yield from walk(item.submenu)
