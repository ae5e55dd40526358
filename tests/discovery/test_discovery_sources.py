"""Which folders discovery scans, per OS, with environment overrides and CLI options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.sources import Source, default_sources, with_cli_dirs


@pytest.fixture()
def paths(tmp_path: Path) -> Paths:
    root = tmp_path / "lmsp"
    return Paths(root / "config", root / "data", root / "cache", root / "run")


def _pairs(sources: list[Source]) -> list[tuple[str, Path]]:
    return [(s.name, s.root) for s in sources]


def test_linux_defaults(paths: Paths, tmp_path: Path) -> None:
    home = tmp_path / "home"
    got = default_sources(paths, Config(), environ={}, home=home, platform="linux")
    assert _pairs(got) == [
        ("lmsp-tray", paths.models_dir),
        ("lm-studio", home / ".lmstudio" / "models"),
        ("lm-studio", home / ".cache" / "lm-studio" / "models"),
        ("ollama", home / ".ollama" / "models"),
        ("ollama", Path("/usr/share/ollama/.ollama/models")),
        ("huggingface", home / ".cache" / "huggingface" / "hub"),
        ("llama.cpp", home / ".cache" / "llama.cpp"),
    ]
    assert {s.layout for s in got if s.name == "ollama"} == {"ollama"}
    assert [s.layout for s in got if s.name == "huggingface"] == ["huggingface"]


def test_macos_and_windows_defaults(paths: Paths, tmp_path: Path) -> None:
    home = tmp_path / "home"
    mac = dict(_pairs(default_sources(paths, Config(), environ={}, home=home, platform="darwin")))
    assert mac["llama.cpp"] == home / "Library" / "Caches" / "llama.cpp"
    assert Path("/usr/share/ollama/.ollama/models") not in mac.values()
    local = tmp_path / "AppData" / "Local"
    win = _pairs(default_sources(paths, Config(), environ={"LOCALAPPDATA": str(local)}, home=home, platform="win32"))
    assert ("llama.cpp", local / "llama.cpp") in win
    assert ("ollama", home / ".ollama" / "models") in win
    assert ("huggingface", home / ".cache" / "huggingface" / "hub") in win


def test_environment_overrides(paths: Paths, tmp_path: Path) -> None:
    env = {
        "OLLAMA_MODELS": str(tmp_path / "om"),
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        "LLAMA_CACHE": str(tmp_path / "lc"),
        "HF_HOME": str(tmp_path / "ignored"),
    }
    got = _pairs(
        default_sources(paths, Config(), environ=env, home=tmp_path / "h", platform="linux", include_system=False)
    )
    assert ("ollama", tmp_path / "om") in got and ("ollama", tmp_path / "h" / ".ollama" / "models") in got
    assert ("huggingface", tmp_path / "hf") in got
    assert ("llama.cpp", tmp_path / "lc") in got
    hf_home = _pairs(
        default_sources(
            paths,
            Config(),
            environ={"HF_HOME": str(tmp_path / "hfh"), "XDG_CACHE_HOME": str(tmp_path / "xdg")},
            home=tmp_path / "h",
            platform="linux",
        )
    )
    assert ("huggingface", tmp_path / "hfh" / "hub") in hf_home
    assert ("llama.cpp", tmp_path / "xdg" / "llama.cpp") in hf_home


def test_lm_studio_settings_and_home_pointer(paths: Paths, tmp_path: Path) -> None:
    home = tmp_path / "home"
    moved = tmp_path / "elsewhere" / ".lmstudio"
    moved.mkdir(parents=True)
    (home).mkdir()
    (home / ".lmstudio-home-pointer").write_text(str(moved) + "\n")
    (moved / "settings.json").write_text(json.dumps({"downloadsFolder": str(tmp_path / "big-disk" / "models")}))
    lms = [s.root for s in default_sources(paths, Config(), environ={}, home=home) if s.name == "lm-studio"]
    assert lms == [
        tmp_path / "big-disk" / "models",
        moved / "models",
        home / ".lmstudio" / "models",
        home / ".cache" / "lm-studio" / "models",
    ]


def test_broken_lm_studio_settings_are_ignored(paths: Paths, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    (home / ".lmstudio" / "settings.json").write_text("{not json")
    lms = [s.root for s in default_sources(paths, Config(), environ={}, home=home) if s.name == "lm-studio"]
    assert lms == [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def test_custom_folders_and_no_default_dirs(paths: Paths, tmp_path: Path) -> None:
    config = Config(models_dirs=[tmp_path / "from-config"])
    cli = with_cli_dirs(config, [tmp_path / "from-cli", tmp_path / "from-config"], no_default_dirs=False)
    assert cli.models_dirs == [tmp_path / "from-config", tmp_path / "from-cli"] and cli.default_dirs
    got = _pairs(default_sources(paths, cli, environ={}, home=tmp_path / "h"))
    assert got[:3] == [
        ("lmsp-tray", paths.models_dir),
        ("custom", tmp_path / "from-config"),
        ("custom", tmp_path / "from-cli"),
    ]
    only = with_cli_dirs(Config(), [tmp_path / "only"], no_default_dirs=True)
    assert _pairs(default_sources(paths, only, environ={}, home=tmp_path / "h")) == [("custom", tmp_path / "only")]


def test_relative_cli_folders_resolve_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert with_cli_dirs(Config(), ["models"]).models_dirs == [tmp_path / "models"]


def test_a_folder_named_twice_is_scanned_once(paths: Paths, tmp_path: Path) -> None:
    home = tmp_path / "h"
    config = Config(models_dirs=[home / ".lmstudio" / "models", paths.models_dir])
    got = _pairs(default_sources(paths, config, environ={}, home=home))
    assert got.count(("custom", home / ".lmstudio" / "models")) == 1
    assert [root for _, root in got].count(home / ".lmstudio" / "models") == 1
    assert [root for _, root in got].count(paths.models_dir) == 1
