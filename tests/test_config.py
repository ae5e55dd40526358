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


# The exact words, one per kind of rule (pinned when the hand-written checks became a pydantic schema).
EXACT = [
    ({"prot": 1}, "unknown setting 'prot'; did you mean 'port'?"),
    ({"kep-alive": 1}, "unknown setting 'kep-alive'; did you mean 'keep_alive'?"),
    ({"zzz": 1}, "unknown setting 'zzz'; the settings are listed in docs/configuration.md"),
    ({"port": True}, "port: expected a positive whole number"),
    ({"port": 70000}, "port: expected a port number up to 65535"),
    ({"max_queue": 1.0}, "max_queue: expected a positive whole number"),
    ({"gpu_layers": -1}, "gpu_layers: expected a positive whole number"),
    ({"context_cap": "big"}, "context_cap: expected a positive whole number"),
    ({"keep-alive": "soon"}, "keep_alive: expected seconds or a duration like '5m', got 'soon'"),
    ({"keep_alive": True}, "keep_alive: expected seconds or a duration like '5m', got True"),
    ({"event_retention": "never"}, "event_retention: must be a finite duration"),
    ({"housekeeping_interval": -1}, "housekeeping_interval: must be a finite duration"),
    ({"sse_keepalive": 0}, "sse_keepalive: must be a duration above zero"),
    ({"idle_timeout": "0s"}, "idle_timeout: must be a positive, finite duration"),
    ({"models_dirs": "~/m"}, "models_dirs: expected a list of folder paths"),
    ({"models_dirs": ["a", 1]}, "models_dirs: expected a list of folder paths"),
    ({"allowed_origins": [None]}, "allowed_origins: expected a list of origins like 'http://localhost:3000'"),
    (
        {"keyless_scopes": "models:read"},
        "keyless_scopes: expected a list of scopes like ['models:read', 'responses:create']",
    ),
    ({"demo_model": 1}, "demo_model: expected true or false"),
    ({"prompt_cache_gib": -1}, "prompt_cache_gib: expected a size in GiB (0 turns the prompt cache off)"),
    ({"memory_budget_fraction": 0}, "memory_budget_fraction: expected a number in (0, 1]"),
    ({"allocator": 1}, "allocator: expected 'auto' or 'system'"),
    ({"host": "::"}, "host: the service only binds loopback (127.0.0.1 or ::1)"),
    ({"gpu": "off", "port": 0, "prot": 1}, "port: expected a positive whole number"),  # the first, as written
    ({"prot": 1, "port": 0}, "unknown setting 'prot'; did you mean 'port'?"),
]


@pytest.mark.parametrize("raw, detail", EXACT)
def test_bad_values_are_told_in_the_same_words(raw: dict, detail: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(raw, source="config.toml")
    assert str(caught.value) == f"config.toml: {detail}" and caught.value.detail == detail
    assert caught.value.setting in {*raw, *(key.replace("-", "_") for key in raw)}
    assert caught.value.setting is not None and caught.value.setting in detail


def test_values_are_converted_as_the_service_uses_them() -> None:
    config = config_from_mapping(
        {"keyless-scopes": ["tasks:read", "models:read", "models:read"], "prompt_cache_gib": 2, "context_cap": "auto"}
    )
    assert config.keyless_scopes == ["models:read", "tasks:read"] and config.context_cap is None
    assert config.prompt_cache_gib == 2.0 and isinstance(config.prompt_cache_gib, float)
    assert config_from_mapping({"idle-timeout": "1.5m", "task_ttl": "never"}).idle_timeout == 90


def test_broken_toml_is_a_config_error(tmp_path: Path) -> None:
    paths = resolve_paths({"LMSP_TRAY_HOME": str(tmp_path)}).ensure()
    paths.config_file.write_text("port = ")
    with pytest.raises(ConfigError, match="config.toml"):
        load_config(paths)


def test_durations() -> None:
    assert parse_duration("5m") == 300 and parse_duration(30) == 30 and parse_duration("1.5h") == 5400
    assert parse_duration(-1) is None and parse_duration("never") is None
    assert Config().keep_alive == 300
