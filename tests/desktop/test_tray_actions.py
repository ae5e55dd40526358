"""The tray's actions as a table of handlers over `ActionHost`, the few members of the tray they use.

`TrayApp` is tested through its menu in test_tray_logic.py; here the handlers run over a small host
of their own, which is all they may need: no icon, no toolkit, no poller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lmsp_tray.desktop.actions import HANDLERS, QUIET, SERIOUS, ActionHost, failure_prefix, run_action
from lmsp_tray.desktop.menu import Action, TrayState


@dataclass
class Backend:
    calls: list[tuple[str, Any]] = field(default_factory=list)
    folder: Path = Path("/nonexistent")

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, args))

    def access_token(self) -> str | None:
        return "lmsp_sk_SECRET"

    def models_folder(self) -> Path:
        return self.folder


@dataclass
class Board:
    text: str | None = None

    def copy(self, text: str) -> None:
        self.text = text


@dataclass
class Host:
    backend: Backend = field(default_factory=Backend)
    state: TrayState = field(default_factory=lambda: TrayState(url="http://127.0.0.1:1/lmsp/v1"))
    clipboard: Board = field(default_factory=Board)
    opened: list[Path] = field(default_factory=list)
    log_file: Path | None = None

    def opener(self, path: Path) -> None:
        self.opened.append(path)

    def safe_snapshot(self) -> TrayState:
        return self.state

    def overlay(self, state: TrayState) -> TrayState:
        return state


def test_every_menu_action_but_quit_has_a_handler() -> None:
    assert set(HANDLERS) == set(Action) - {Action.QUIT}
    assert SERIOUS == {Action.LOAD_MODEL, Action.UNLOAD_MODEL, Action.UNLOAD_ALL}
    assert QUIET == {Action.OPEN_MODELS_FOLDER, Action.VIEW_LOGS, Action.SHOW_STATUS}
    with pytest.raises(ValueError, match="unknown action"):
        run_action(Host(), Action.QUIT, None)
    assert failure_prefix(Action.QUIT, None) == "Failed"


def test_handlers_need_only_the_host_protocol(tmp_path: Path) -> None:
    host: ActionHost = Host()
    assert run_action(host, Action.LOAD_MODEL, "qwen3:8b") == ("Loaded qwen3:8b", "It answers requests now.")
    assert run_action(host, Action.COPY_TOKEN, None) == (
        "Access token copied to the clipboard",
        "Paste it into your app as its bearer token; it has every scope, so keep it private.",
    )
    assert run_action(host, Action.UNLOAD_ALL, None) is None
    real = Host(backend=Backend(folder=tmp_path / "models"))
    assert run_action(real, Action.OPEN_MODELS_FOLDER, None) is None
    assert real.opened == [tmp_path / "models"] and (tmp_path / "models").is_dir()
    assert isinstance(host, Host)
    assert host.backend.calls == [("load_model", ("qwen3:8b",)), ("unload_all", ())]
    assert host.clipboard.text == "lmsp_sk_SECRET"
    with pytest.raises(ValueError, match="names no model"):
        run_action(host, Action.DENY_PAIRING, None)


def test_failure_titles_name_the_target_cleaned() -> None:
    assert failure_prefix(Action.LOAD_MODEL, "a{0}\nb") == "Could not load a{0} b"
    assert failure_prefix(Action.RESCAN, "ignored") == "Rescan failed"
