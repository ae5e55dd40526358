"""The tray menu as a pure function of the service's state.

Everything the tray shows is decided here, with no GUI toolkit imported:
`build_menu(TrayState) -> list[MenuItemSpec]`. `lmsp_tray.desktop.tray` turns the
specs into pystray items and routes each item's `Action` to a `TrayBackend`
call. Keeping the decisions here makes the menu unit-testable without a
display, and keeps the GUI layer a thin, mechanical translation.

Texts that come from outside (model ids, error reasons, the names that
pairing apps give themselves) are cleaned and shortened before they reach
the menu; the access token never does.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# Activities: what the icon shows, most urgent first.
IDLE = "idle"
LOADING = "loading"
SERVING = "serving"
ERROR = "error"
ACTIVITIES = (IDLE, LOADING, SERVING, ERROR)

# Model states, as in the LMSP model object (PROFILE §3).
AVAILABLE = "available"
MODEL_LOADING = "loading"
LOADED = "loaded"
UNLOADING = "unloading"
MODEL_ERROR = "error"
MODEL_STATES = (AVAILABLE, MODEL_LOADING, LOADED, UNLOADING, MODEL_ERROR)

ERROR_MARK = "\u26a0"  # ⚠
ELLIPSIS = "\u2026"  # …
MAX_ERROR_CHARS = 60
MAX_NAME_CHARS = 40
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
    DENY_PAIRING = "deny_pairing"  # arg: pairing id
    QUIT = "quit"


@dataclass(frozen=True)
class ModelView:
    """One discovered model as the tray shows it."""

    id: str
    size_bytes: int | None = None
    quantization: str | None = None
    state: str = AVAILABLE  # one of MODEL_STATES
    error: str | None = None  # the reason, when state is "error"
    generating: bool = False  # a response is being generated on it now


@dataclass(frozen=True)
class PairingView:
    """A pending request from a local app for a token; the user approves or denies it."""

    id: str
    app_name: str
    scopes: tuple[str, ...] = ()
    user_code: str = ""


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
    notice: str | None = None  # a service-level problem or the last failed action, shown on top

    def __post_init__(self) -> None:
        # Accept lists from callers but keep the state hashable and comparable.
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "pairings", tuple(self.pairings))

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


def clean_text(text: object, limit: int) -> str:
    """One line of at most `limit` characters: control and bidi characters removed, spaces collapsed."""
    value = _SPACES.sub(" ", _CONTROL.sub(" ", str(text))).strip()
    if len(value) > limit:
        value = value[: max(limit - 1, 1)].rstrip() + ELLIPSIS
    return value


def short_reason(reason: object, limit: int = MAX_ERROR_CHARS) -> str:
    """The first non-empty line of an error reason, cleaned and shortened."""
    lines = [line for line in str(reason or "").splitlines() if line.strip()]
    return clean_text(lines[0], limit) if lines else "unknown error"


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


def activity_for(models: tuple[ModelView, ...] | list[ModelView], *, failed: bool = False) -> str:
    """The icon state: error (a service problem or failed action), loading, serving, else idle.

    A model whose file cannot be read is marked on its own menu line; it does
    not turn the icon red, or one stray broken file would keep it red forever.
    """
    if failed:
        return ERROR
    if any(m.state in (MODEL_LOADING, UNLOADING) for m in models):
        return LOADING
    if any(m.generating for m in models):
        return SERVING
    return IDLE


_URGENCY = {IDLE: 0, SERVING: 1, LOADING: 2, ERROR: 3}


def most_urgent(*activities: str) -> str:
    """The activity the icon should show when several apply (error > loading > serving > idle)."""
    return max(activities, key=lambda a: _URGENCY.get(a, 0), default=IDLE)


def tooltip(state: TrayState) -> str:
    """The icon's hover text: name, what it is doing, where it listens."""
    loaded = state.loaded_count
    if state.activity == ERROR and state.notice:
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


def model_label(model: ModelView) -> str:
    """`id · 253 MB · Q4_K_M`, then what is happening to it."""
    parts = [clean_text(model.id, 80)]
    size = human_size(model.size_bytes)
    if size:
        parts.append(size)
    if model.quantization:
        parts.append(clean_text(model.quantization, 16))
    label = " \u00b7 ".join(parts)
    if model.state == MODEL_LOADING:
        return f"{label} \u2014 Loading{ELLIPSIS}"
    if model.state == UNLOADING:
        return f"{label} \u2014 Unloading{ELLIPSIS}"
    if model.state == MODEL_ERROR:
        reason = short_reason(model.error)
        return f"{label} \u2014 {ERROR_MARK} error: {reason}"
    if model.state == LOADED and model.generating:
        return f"{label} \u2014 generating"
    return label


def model_item(model: ModelView) -> MenuItemSpec:
    """Loaded: checked, click unloads. Available or failed: click loads (retries). Busy: disabled."""
    label = model_label(model)
    if model.state == LOADED:
        return MenuItemSpec(label, Action.UNLOAD_MODEL, model.id, checked=True)
    if model.state in (MODEL_LOADING, UNLOADING):
        return MenuItemSpec(label, None, model.id, checked=model.state == UNLOADING, enabled=False)
    return MenuItemSpec(label, Action.LOAD_MODEL, model.id, checked=False)


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
        items.append(MenuItemSpec("No models found", enabled=False))
        items.append(MenuItemSpec("Put .gguf files in the models folder, then Rescan", enabled=False))
    for model in state.models[:MAX_MODELS_SHOWN]:
        items.append(model_item(model))
    hidden = len(state.models) - MAX_MODELS_SHOWN
    if hidden > 0:
        items.append(MenuItemSpec(f"{hidden} more not shown (see GET /models)", enabled=False))
    return tuple(items)


def build_menu(state: TrayState) -> list[MenuItemSpec]:
    """The whole tray menu for `state`."""
    any_loaded = any(m.state in (LOADED, MODEL_LOADING) for m in state.models)
    loaded, total = state.loaded_count, len(state.models)
    items: list[MenuItemSpec] = [
        MenuItemSpec(status_line(state), Action.COPY_URL, enabled=state.url is not None),
    ]
    if state.notice:
        items.append(MenuItemSpec(f"{ERROR_MARK} {clean_text(state.notice, 80)}", enabled=False))
    items.append(MenuItemSpec("Open lmsp-tray", Action.OPEN_CONSOLE, enabled=state.url is not None, default=True))
    items.append(SEPARATOR)
    items.append(
        MenuItemSpec(f"Models ({loaded}/{total} loaded)" if total else "Models", submenu=models_submenu(state))
    )
    items.append(MenuItemSpec("Unload all", Action.UNLOAD_ALL, enabled=any_loaded))
    items.append(MenuItemSpec("Rescan models", Action.RESCAN))
    items.append(MenuItemSpec("Open models folder", Action.OPEN_MODELS_FOLDER))
    if state.pairings:
        items.append(SEPARATOR)
        count = len(state.pairings)
        items.append(MenuItemSpec(f"Pairing request{'s' if count != 1 else ''} ({count})", enabled=False))
        items.extend(pairing_item(p) for p in state.pairings)
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
    items.append(SEPARATOR)
    items.append(MenuItemSpec("Quit", Action.QUIT))
    return items


def walk(items: list[MenuItemSpec] | tuple[MenuItemSpec, ...]):
    """Every item, depth first (submenus after their parent)."""
    for item in items:
        yield item
        if item.submenu:
            yield from walk(item.submenu)
