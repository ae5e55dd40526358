"""Paths and config.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmsp_tray.config import Config, ConfigError, config_from_mapping, load_config, parse_duration, resolve_paths


def test_home_puts_everything_under_one_folder(tmp_path: Path) -> None:
    paths = resolve_paths({"LMSP_TRAY_HOME": str(tmp_path)}).ensure()
    for folder in (paths.config_dir, paths.data_dir, paths.cache_dir, paths.runtime_dir, paths.models_dir):
        assert folder.is_dir() and tmp_path in folder.parents
    assert paths.discovery_file.name == "service.json"


def test_platformdirs_without_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    paths = resolve_paths({})
    assert paths.config_dir == tmp_path / "cfg" / "lmsp-tray"
    assert paths.data_dir == tmp_path / "data" / "lmsp-tray"


def test_config_file_values(tmp_path: Path) -> None:
    paths = resolve_paths({"LMSP_TRAY_HOME": str(tmp_path)}).ensure()
    paths.config_file.write_text(
        'port = 9000\nkeep-alive = "10m"\nmodels_dirs = ["~/m"]\ncontext_cap = 4096\n'
        'gpu = "off"\nallowed_origins = ["http://localhost:3000/"]\nallocator = "system"\n'
    )
    config = load_config(paths)
    assert config.port == 9000 and config.keep_alive == 600 and config.context_cap == 4096
    assert config.models_dirs == [Path("~/m").expanduser()] and config.gpu == "off"
    assert config.allowed_origins == ["http://localhost:3000"] and config.allocator == "system"


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"prot": 1}, "unknown setting"),
        ({"port": "80"}, "whole number"),
        ({"port": 70000}, "65535"),
        ({"host": "0.0.0.0"}, "loopback"),
        ({"gpu": "yes"}, "auto"),
        ({"gpu": {}}, "auto"),  # an inline table (unhashable) is refused, not a TypeError
        ({"allocator": "jemalloc"}, "'auto' or 'system'"),
        ({"host": ["127.0.0.1"]}, "loopback"),
        ({"keep_alive": "soon"}, "duration"),
        ({"memory_budget_fraction": 2}, "(0, 1]"),
    ],
)
def test_bad_values_are_named(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")):
        config_from_mapping(raw)


def test_broken_toml_is_a_config_error(tmp_path: Path) -> None:
    paths = resolve_paths({"LMSP_TRAY_HOME": str(tmp_path)}).ensure()
    paths.config_file.write_text("port = ")
    with pytest.raises(ConfigError, match="config.toml"):
        load_config(paths)


def test_durations() -> None:
    assert parse_duration("5m") == 300 and parse_duration(30) == 30 and parse_duration("1.5h") == 5400
    assert parse_duration(-1) is None and parse_duration("never") is None
    assert Config().keep_alive == 300
