"""`lmsp-tray open`: a real CLI process against a running service; the link reaches the browser through
a private redirect file, never on a command line; `--print-url`; and how a sandboxed browser is told."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lmsp_tray.console_link import default_browser_sandboxed, redirect_page


def run_open(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmsp_tray", "open", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def cli_env(daemon, lmsp_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "BROWSER"}}
    env.update(LMSP_TRAY_HOME=str(lmsp_home), LMSP_TRAY_TOKEN=daemon.owner_token)
    return env


def code_of(url: str) -> str:
    match = re.fullmatch(r"http://127\.0\.0\.1:\d+/console/#code=(lmspc_[A-Za-z0-9_-]{43})", url)
    assert match, url
    return match.group(1)


def test_print_url_gives_a_working_single_use_link(daemon, cli_env: dict[str, str]) -> None:
    out = run_open("--print-url", env=cli_env)
    assert out.returncode == 0, out.stderr
    url = out.stdout.strip()
    assert url.startswith(daemon.base) and "works once" in out.stderr
    code = code_of(url)
    assert httpx.post(daemon.url + "/console/sessions", json={"code": code}, timeout=30).status_code == 201
    assert httpx.post(daemon.url + "/console/sessions", json={"code": code}, timeout=30).status_code == 401


def test_the_browser_gets_a_private_redirect_file_not_the_code(daemon, cli_env: dict[str, str], tmp_path: Path) -> None:
    record = tmp_path / "browser-argv.txt"
    fake = tmp_path / "fake-browser"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n')
    fake.chmod(0o755)
    env = {**cli_env, "BROWSER": str(fake), "DISPLAY": ":404", "PATH": "/usr/bin:/bin"}  # no xdg-settings
    out = run_open(env=env)
    assert out.returncode == 0, out.stderr
    argv = record.read_text().strip()
    assert argv.startswith("file://") and argv.endswith("/console-open.html") and "lmspc_" not in argv
    page = Path(argv.removeprefix("file://"))
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and stat.S_IMODE(page.parent.stat().st_mode) == 0o700
    url = re.search(r"url=(http://[^'\"]+)", page.read_text()).group(1)
    assert httpx.post(daemon.url + "/console/sessions", json={"code": code_of(url)}, timeout=30).status_code == 201


def test_without_a_display_the_link_is_printed(daemon, cli_env: dict[str, str]) -> None:
    out = run_open(env=cli_env)
    assert out.returncode == 0 and "no display" in out.stderr
    code_of(out.stdout.strip())


def test_open_when_nothing_runs(tmp_path: Path) -> None:
    env = {**os.environ, "LMSP_TRAY_HOME": str(tmp_path / "empty")}
    out = run_open("--print-url", env=env)
    assert out.returncode == 1 and "not running" in out.stderr and "Traceback" not in out.stderr


def test_redirect_page_escapes_the_url() -> None:
    page = redirect_page("http://127.0.0.1:7373/console/#code=a'b\"<c>")
    assert "a&#x27;b&quot;&lt;c&gt;" in page and "<c>" not in page


def test_snap_and_flatpak_browsers_are_given_the_url(tmp_path: Path) -> None:
    data = tmp_path / "share"
    (data / "applications").mkdir(parents=True)
    (data / "applications" / "chromium.desktop").write_text("[Desktop Entry]\n")

    def asks(desktop_id: str) -> bool:
        def run(*_a, **_k) -> subprocess.CompletedProcess:
            return subprocess.CompletedProcess([], 0, stdout=f"{desktop_id}\n", stderr="")

        env = {"XDG_DATA_HOME": str(data), "XDG_DATA_DIRS": str(tmp_path / "none")}
        return default_browser_sandboxed(env, run, which=lambda _: "/usr/bin/xdg-settings", platform="linux")

    assert asks("chromium.desktop") is False  # an ordinary browser reads the redirect file
    assert asks("firefox_firefox.desktop") is True  # a snap's id: it cannot, so it gets the URL
    assert asks("") is False
    assert default_browser_sandboxed({}, platform="darwin") is False
