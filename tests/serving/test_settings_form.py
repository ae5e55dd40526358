"""The console's settings (serving/settings.py): checked by config.py's rules, written back to a real
config.toml keeping what a person wrote, applied live through the daemon, and over HTTP."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf_factory import write_tiny_gguf

from lmsp_tray.config import Config, Paths
from lmsp_tray.errors import Conflict, InvalidRequest
from lmsp_tray.serving.settings import Settings

WRITTEN = """# lmsp-tray settings, by hand
port = 7373   # the usual one
max_queue = 8 # not in the form
models_dirs = [
  "~/models",  # my disk
]
"""


class Login:
    supported = True

    def __init__(self) -> None:
        self.enabled = False

    def is_enabled(self) -> bool:
        return self.enabled

    def set(self, enabled: bool) -> None:
        self.enabled = enabled


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path / "config", tmp_path / "data", tmp_path / "cache", tmp_path / "run").ensure()


def make(paths: Paths, login: Any = None) -> tuple[Settings, list[dict[str, Any]]]:
    applied: list[dict[str, Any]] = []
    return Settings(paths, lambda: Config(), apply=lambda v: applied.append(dict(v)), login_item=login), applied


def test_changes_are_written_keeping_comments_and_other_keys(paths: Paths) -> None:
    paths.config_file.write_text(WRITTEN)
    os.chmod(paths.config_file, 0o600)
    settings, applied = make(paths)
    doc = settings.update({"keep_alive": "10m", "context_cap": 4096, "port": 8123})
    text = paths.config_file.read_text()
    assert tomllib.loads(text) == {
        "port": 8123,
        "max_queue": 8,
        "models_dirs": ["~/models"],
        "keep_alive": "10m",
        "context_cap": 4096,
    }
    for comment in ("# lmsp-tray settings, by hand", "# the usual one", "# not in the form", "# my disk"):
        assert comment in text
    assert os.stat(paths.config_file).st_mode & 0o777 == 0o600
    assert applied == [{"keep_alive": 600.0, "context_cap": 4096}]  # coerced, and not the port
    assert doc["applied"] == ["context_cap", "keep_alive"] and doc["restart_required"] == ["port"]
    assert doc["values"]["port"] == 8123 and doc["running"]["port"] == 7373


def test_null_removes_a_key_and_its_default_applies(paths: Paths) -> None:
    paths.config_file.write_text('keep_alive = "1h"\nparallel = 2\n')
    settings, applied = make(paths)
    doc = settings.update({"keep_alive": None, "parallel": None})
    assert tomllib.loads(paths.config_file.read_text()) == {}
    assert applied == [{"keep_alive": 300.0, "parallel": None}]
    assert doc["values"]["keep_alive"] == "5m" and doc["values"]["parallel"] is None


def test_ollama_port_is_set_after_the_tables_and_removed_by_null(paths: Paths) -> None:
    """The second listener's port: set from the form into a file that has a table (the key stays at the
    top level, where TOML reads it as a setting), needs a restart, and null takes it out again (off)."""
    paths.config_file.write_text('keep_alive = "1h"\n\n[model_aliases]\n"claude-x" = "tiny"\n')
    settings, applied = make(paths)
    doc = settings.update({"ollama_port": 11434})
    assert tomllib.loads(paths.config_file.read_text()) == {
        "keep_alive": "1h",
        "ollama_port": 11434,
        "model_aliases": {"claude-x": "tiny"},
    }
    assert doc["restart_required"] == ["ollama_port"] and applied == []
    assert next(f for f in doc["fields"] if f["key"] == "ollama_port")["kind"] == "optional_port"
    settings.update({"ollama_port": None})
    assert "ollama_port" not in tomllib.loads(paths.config_file.read_text())


@pytest.mark.parametrize(
    "change, param",
    [
        ({"port": 70000}, "port"),
        ({"port": "80"}, "port"),
        ({"ollama_port": 70000}, "ollama_port"),
        ({"keep_alive": "soon"}, "keep_alive"),
        ({"context_cap": 0}, "context_cap"),
        ({"gpu": "sometimes"}, "gpu"),
        ({"models_dirs": "/one/folder"}, "models_dirs"),
        ({"models_dirs": ["  "]}, "models_dirs"),
        ({"allowed_origins": ["http://evil"]}, "allowed_origins"),  # not a form setting
        ({"start_at_login": "yes"}, "start_at_login"),
    ],
)
def test_bad_values_name_their_field_and_write_nothing(paths: Paths, change: dict, param: str) -> None:
    paths.config_file.write_text(WRITTEN)
    settings, applied = make(paths, Login())
    with pytest.raises(InvalidRequest) as caught:
        settings.update(change)
    assert caught.value.param == param
    assert paths.config_file.read_text() == WRITTEN and applied == []


def test_bad_values_are_told_in_config_toml_words(paths: Paths) -> None:
    settings, applied = make(paths)
    with pytest.raises(InvalidRequest) as caught:
        settings.update({"keep_alive": "5m", "port": 70000, "gpu": "sometimes"})  # the first bad one is named
    assert (caught.value.detail, caught.value.param) == ("port: expected a port number up to 65535", "port")
    assert not paths.config_file.exists() and applied == []


def test_a_file_that_does_not_parse_is_never_overwritten(paths: Paths) -> None:
    paths.config_file.write_text("port = = 1\n")
    settings, _ = make(paths)
    with pytest.raises(Conflict, match="not valid TOML"):
        settings.update({"keep_alive": "1m"})
    assert paths.config_file.read_text() == "port = = 1\n"


def test_a_file_with_an_unknown_key_is_not_made_worse(paths: Paths) -> None:
    paths.config_file.write_text("prot = 1\n")
    settings, _ = make(paths)
    with pytest.raises(Conflict, match="unknown setting 'prot'"):
        settings.update({"keep_alive": "1m"})
    assert paths.config_file.read_text() == "prot = 1\n"


def test_a_missing_file_is_created(paths: Paths) -> None:
    settings, _ = make(paths)
    assert settings.document()["values"]["keep_alive"] == "5m"
    settings.update({"gpu": "off"})
    assert tomllib.loads(paths.config_file.read_text()) == {"gpu": "off"}


def test_start_at_login_goes_to_the_login_item(paths: Paths) -> None:
    login = Login()
    settings, _ = make(paths, login)
    assert settings.document()["values"]["start_at_login"] is False
    doc = settings.update({"start_at_login": True})
    assert login.enabled and doc["values"]["start_at_login"] is True and "start_at_login" in doc["applied"]
    assert not paths.config_file.exists()  # not a config.toml key
    without, _ = make(paths)
    assert "start_at_login" not in without.document()["values"]
    with pytest.raises(Conflict, match="autostart"):
        without.update({"start_at_login": True})


# -- over HTTP, applied to the live daemon -------------------------------------------------------
def test_new_model_folder_is_scanned_at_once(daemon_factory, tmp_path: Path) -> None:
    live = daemon_factory()
    extra = tmp_path / "more-models"
    extra.mkdir()
    write_tiny_gguf(extra / "extra-model.gguf", basename="extra-model", size_label="1M")
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=60) as c:
        before = {m["id"] for m in c.get("/models").json()["data"]}
        folders = [str(p) for p in live.daemon.config.models_dirs] + [str(extra)]
        r = c.patch("/settings", json={"models_dirs": folders, "keep_alive": "never"})
        assert r.status_code == 200, r.text
        assert set(r.json()["applied"]) == {"models_dirs", "keep_alive"}
        after = {m["id"] for m in c.get("/models").json()["data"]}
        assert after - before == {"extra-model:1m-f32"}  # no restart, no rescan needed
        c.post("/models/extra-model:1m-f32/load").raise_for_status()
        assert live.daemon.config.keep_alive is None and live.daemon.service.config.keep_alive is None
        r = c.patch("/settings", json={"port": 0})
        assert r.status_code == 400 and r.json()["param"] == "port"
        r = c.patch("/settings", json={"port": 8124})
        assert r.json()["restart_required"] == ["port"]
        assert r.json()["running"]["port"] == int(live.base.rsplit(":", 1)[1])
