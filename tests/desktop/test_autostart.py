"""Start at login: real XDG files on Linux in a temp HOME; the LaunchAgent and Run-key backends by
what they write (plist parsed with plistlib; registry through the thin interface)."""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT

from lmsp_tray.desktop.autostart import (
    APPROVED_KEY,
    RUN_KEY,
    Autostart,
    AutostartStatus,
    LaunchAgent,
    WindowsRun,
    XDGAutostart,
    autostart_command,
    desktop_exec,
    launch_command,
    parse_desktop_exec,
    split_windows_cmdline,
)

TRICKY = ["/opt/My Apps/lmsp tray/bin/lmsp-tray", "--name", 'a "q" $HOME `x` \\back 50% ;&|', "", "plain"]


def linux(home: Path, **env: str) -> Autostart:
    return Autostart.for_platform(
        "linux", environ={"HOME": str(home), **env}, home=home, command=["/usr/bin/lmsp-tray"]
    )


# -- launch command -------------------------------------------------------------------------------


def test_launch_command_frozen_is_the_executable(tmp_path):
    exe = tmp_path / "lmsp-tray"
    assert launch_command(frozen=True, executable=str(exe)) == [str(exe)]


def test_launch_command_prefers_the_console_script_next_to_python(tmp_path):
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    python = bindir / "python"
    assert launch_command(frozen=False, executable=str(python), platform="linux") == [str(python), "-m", "lmsp_tray"]
    script = bindir / "lmsp-tray"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert launch_command(frozen=False, executable=str(python), platform="linux") == [str(script)]
    assert launch_command(["--headless"], frozen=False, executable=str(python), platform="linux") == [
        str(script),
        "--headless",
    ]


def test_launch_command_on_windows_uses_pythonw(tmp_path):
    python = tmp_path / "python.exe"
    (tmp_path / "lmsp-tray.exe").write_text("")
    assert launch_command(frozen=False, executable=str(python), platform="win32") == [str(tmp_path / "lmsp-tray.exe")]
    (tmp_path / "pythonw.exe").write_text("")
    assert launch_command(frozen=False, executable=str(python), platform="win32") == [
        str(tmp_path / "pythonw.exe"),
        "-m",
        "lmsp_tray",
    ]


def test_launch_command_of_this_process_runs_this_package():
    argv = launch_command()
    assert Path(argv[0]).is_absolute()
    if argv[1:3] == ["-m", "lmsp_tray"]:
        assert argv[0] == str(Path(sys.executable).absolute())


# -- XDG (real files) -----------------------------------------------------------------------------


def test_off_by_default_and_reading_writes_nothing(tmp_path):
    auto = linux(tmp_path)
    st = auto.status()
    assert (st.supported, st.enabled, st.mechanism) == (True, False, "XDG autostart")
    assert st.location == str(tmp_path / ".config" / "autostart" / "lmsp-tray.desktop")
    assert autostart_command("status", auto)[0] == 0
    assert not (tmp_path / ".config").exists()


def test_enable_status_disable_roundtrip(tmp_path):
    auto = linux(tmp_path)
    code, msg = autostart_command("enable", auto)
    path = tmp_path / ".config" / "autostart" / "lmsp-tray.desktop"
    assert code == 0 and str(path) in msg and "/usr/bin/lmsp-tray" in msg
    text = path.read_text()
    assert (
        "Exec=/usr/bin/lmsp-tray\n" in text and "Type=Application" in text and "X-GNOME-Autostart-enabled=true" in text
    )
    assert auto.status() == AutostartStatus(True, True, "XDG autostart", str(path), ("/usr/bin/lmsp-tray",))
    code, msg = autostart_command("status", auto)
    assert code == 0 and msg.startswith("Start at login: enabled")
    assert autostart_command("enable", auto)[0] == 0  # idempotent
    code, msg = autostart_command("disable", auto)
    assert code == 0 and "disabled" in msg and not path.exists()
    assert autostart_command("disable", auto) == (0, "Start at login was not enabled; nothing to do.")
    assert autostart_command("status", auto)[1].startswith("Start at login: disabled")


def test_xdg_config_home_is_respected(tmp_path):
    cfg = tmp_path / "cfg"
    auto = linux(tmp_path, XDG_CONFIG_HOME=str(cfg))
    auto.enable()
    assert (cfg / "autostart" / "lmsp-tray.desktop").is_file()
    assert not (tmp_path / ".config").exists()
    # A relative XDG_CONFIG_HOME is invalid by the spec and ignored.
    assert linux(tmp_path, XDG_CONFIG_HOME="rel/cfg").status().location.startswith(str(tmp_path / ".config"))


def test_real_process_environment_in_a_temp_home(tmp_path):
    """The module as the CLI will call it, in a fresh process whose HOME is a temp folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME",)}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    script = "import sys; from lmsp_tray.desktop.autostart import autostart_command as a; c, m = a(sys.argv[1]); print(m); sys.exit(c)"

    def run(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", script, action], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
        )

    assert "disabled" in run("status").stdout
    enabled = run("enable")
    assert enabled.returncode == 0, enabled.stderr
    path = tmp_path / ".config" / "autostart" / "lmsp-tray.desktop"
    argv = parse_desktop_exec(next(l for l in path.read_text().splitlines() if l.startswith("Exec="))[5:])
    assert argv == launch_command() or argv[1:] == ["-m", "lmsp_tray"]
    assert "enabled" in run("status").stdout
    assert run("disable").returncode == 0 and not path.exists()
    assert "disabled" in run("status").stdout


def test_desktop_exec_roundtrip():
    assert desktop_exec(["/usr/bin/lmsp-tray"]) == "/usr/bin/lmsp-tray"
    assert parse_desktop_exec(desktop_exec(TRICKY)) == TRICKY
    assert "%%" in desktop_exec(["50%"])


def test_a_desktop_launcher_runs_exactly_the_registered_argv(tmp_path):
    """GIO (what GNOME and others use to start autostart entries) reads our Exec= and runs it."""
    gi = pytest.importorskip("gi")
    gi.require_version("Gio", "2.0")
    from gi.repository import Gio

    marker = tmp_path / "out dir" / "argv.txt"
    marker.parent.mkdir()
    # The program itself sits in a folder with a space (TryExec= and Exec= must both find it).
    bindir = tmp_path / "My Programs"
    bindir.mkdir()
    (bindir / "py thon").symlink_to(sys.executable)
    code = "import sys, json; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    argv = [str(bindir / "py thon"), "-c", code, str(marker), *TRICKY[1:]]
    auto = Autostart(XDGAutostart(tmp_path / "cfg"))
    auto.enable(argv)
    info = Gio.DesktopAppInfo.new_from_filename(auto.status().location)
    assert info is not None and info.launch([], None)
    for _ in range(300):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.05)
    import json

    assert json.loads(marker.read_text()) == TRICKY[1:]


@pytest.mark.parametrize(
    "line,note",
    [
        ("Hidden=true", "marked Hidden"),
        ("X-GNOME-Autostart-enabled=false", "turned off in the desktop's startup settings"),
    ],
)
def test_status_honours_a_desktop_turning_it_off(tmp_path, line, note):
    auto = linux(tmp_path)
    auto.enable()
    path = Path(auto.status().location)
    path.write_text(path.read_text().replace("X-GNOME-Autostart-enabled=true", line))
    st = auto.status()
    assert not st.enabled and st.note == note and st.command == ("/usr/bin/lmsp-tray",)
    assert auto.enable().enabled  # the user's explicit action turns it back on


def test_write_failure_is_a_message_not_a_traceback(tmp_path):
    (tmp_path / ".config").mkdir()
    (tmp_path / ".config" / "autostart").write_text("not a folder")
    code, msg = autostart_command("enable", linux(tmp_path))
    assert code == 1 and msg.startswith("Could not enable start at login: cannot write")


def test_bad_action_and_unsupported_platform(tmp_path):
    assert autostart_command("toggle", linux(tmp_path))[0] == 2
    odd = Autostart.for_platform("plan9", environ={}, home=tmp_path)
    assert not odd.supported and not odd.status().supported
    assert autostart_command("enable", odd)[0] == 2
    assert autostart_command("status", odd)[0] == 0


# -- macOS LaunchAgent (by what it writes) --------------------------------------------------------


def test_launch_agent_plist(tmp_path):
    auto = Autostart.for_platform(
        "darwin", environ={}, home=tmp_path, command=["/Applications/lmsp-tray.app/Contents/MacOS/lmsp-tray"]
    )
    assert isinstance(auto.backend, LaunchAgent) and not auto.status().enabled
    code, msg = autostart_command("enable", auto)
    path = tmp_path / "Library" / "LaunchAgents" / "dev.lmsp-tray.plist"
    assert code == 0 and str(path) in msg
    doc = plistlib.loads(path.read_bytes())
    assert doc["Label"] == "dev.lmsp-tray"
    assert doc["ProgramArguments"] == ["/Applications/lmsp-tray.app/Contents/MacOS/lmsp-tray"]
    assert doc["RunAtLoad"] is True and doc["KeepAlive"] is False
    assert doc["LimitLoadToSessionType"] == "Aqua" and doc["ProcessType"] == "Interactive"
    assert doc["StandardErrorPath"] == str(tmp_path / "Library" / "Logs" / "lmsp-tray.log")
    assert auto.status().enabled and auto.status().command == tuple(doc["ProgramArguments"])
    doc["Disabled"] = True
    path.write_bytes(plistlib.dumps(doc))
    assert not auto.status().enabled and auto.status().note == "marked Disabled"
    assert autostart_command("disable", auto)[0] == 0 and not path.exists()


def test_launch_agent_keeps_tricky_arguments(tmp_path):
    agent = LaunchAgent(tmp_path)
    agent.write(TRICKY)
    assert plistlib.loads(agent.path.read_bytes())["ProgramArguments"] == TRICKY


# -- Windows Run key (through the registry interface) ---------------------------------------------


class MemoryRegistry:
    """Records what the backend would write to HKCU (the winreg calls are a thin pass-through)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], object] = {}

    def get_value(self, key, name):
        return self.values.get((key, name))

    def set_string(self, key, name, value):
        assert isinstance(value, str)
        self.values[key, name] = value

    def delete_value(self, key, name):
        return self.values.pop((key, name), None) is not None


def test_windows_run_value(tmp_path):
    reg = MemoryRegistry()
    exe = r"C:\Program Files\lmsp-tray\lmsp-tray.exe"
    auto = Autostart.for_platform("win32", environ={}, home=tmp_path, registry=reg, command=[exe])
    assert isinstance(auto.backend, WindowsRun) and not auto.status().enabled
    code, msg = autostart_command("enable", auto)
    assert code == 0 and r"HKCU\Software\Microsoft\Windows\CurrentVersion\Run\lmsp-tray" in msg
    assert reg.values == {(RUN_KEY, "lmsp-tray"): r'"C:\Program Files\lmsp-tray\lmsp-tray.exe"'}
    assert auto.status().command == (exe,)
    assert autostart_command("disable", auto)[0] == 0 and reg.values == {}


def test_windows_task_manager_off_is_shown_and_enable_lifts_it(tmp_path):
    reg = MemoryRegistry()
    auto = Autostart(WindowsRun(reg), command=[r"C:\lmsp\lmsp-tray.exe"])
    auto.enable()
    reg.values[APPROVED_KEY, "lmsp-tray"] = bytes([3] + [0] * 11)
    st = auto.status()
    assert not st.enabled and st.note == "turned off in Task Manager"
    assert auto.enable().enabled and (APPROVED_KEY, "lmsp-tray") not in reg.values
    reg.values[APPROVED_KEY, "lmsp-tray"] = bytes([2] + [0] * 11)
    assert auto.status().enabled


@pytest.mark.parametrize(
    "argv",
    [
        [r"C:\Program Files\Python311\pythonw.exe", "-m", "lmsp_tray"],
        [r"C:\a b\x.exe", 'say "hi"', "trail\\", r"back\\slash", ""],
    ],
)
def test_windows_command_line_roundtrip(argv):
    assert split_windows_cmdline(subprocess.list2cmdline(argv)) == argv
