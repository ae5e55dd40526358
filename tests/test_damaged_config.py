"""A damaged config.toml (issue 15 D): one clear message naming the file and what to do, the file
kept as it is, for each kind of damage (binary, UTF-16, a folder, cut mid-character, not TOML)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmsp_tray.config import ConfigError, load_config, resolve_paths

DAMAGE = {
    "binary": (b"\x00\x01\x02\xff\xfe\x80GGUF" * 50, "not UTF-8 text"),
    "utf-16": ("port = 7373\n".encode("utf-16"), "UTF-16 text"),
    "utf-16-be": ("port = 7373\n".encode("utf-16-be").join([b"\xfe\xff", b""]), "UTF-16 text"),
    "cut mid-character": ('allowed_origins = ["http://é'.encode()[:-1], "not UTF-8 text"),
    "not toml": (b"port: 7373\n", "not valid TOML"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_config_is_named_with_what_to_do(tmp_path: Path, kind: str) -> None:
    paths = resolve_paths({"LMSP_TRAY_HOME": str(tmp_path)}).ensure()
    data, said = DAMAGE[kind]
    paths.config_file.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_config(paths)
    message = str(info.value)
    assert str(paths.config_file) in message and said in message, message
    assert "fix or remove it" in message
    assert paths.config_file.read_bytes() == data  # never rewritten or deleted


def test_a_folder_in_place_of_the_config(tmp_path: Path) -> None:
    paths = resolve_paths({"LMSP_TRAY_HOME": str(tmp_path)}).ensure()
    paths.config_file.mkdir()
    with pytest.raises(ConfigError) as info:
        load_config(paths)
    assert str(paths.config_file) in str(info.value) and "is a folder" in str(info.value)


def test_the_cli_says_it_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS"}}
    env["LMSP_TRAY_HOME"] = str(tmp_path)
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(DAMAGE["binary"][0])
    out = subprocess.run(
        [sys.executable, "-m", "lmsp_tray", "serve", "--no-default-dirs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(config) in out.stderr and "not UTF-8 text" in out.stderr
