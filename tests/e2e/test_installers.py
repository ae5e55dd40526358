"""Installers: the Linux install/uninstall scripts for real (temp HOME, real venv and pip),
and the macOS / Windows files by what they contain (no Mac or Windows here)."""

from __future__ import annotations

import configparser
import json
import os
import plistlib
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from support import ROOT, cli_token, wait_until

from lmsp_tray.desktop.autostart import LaunchAgent

LINUX = ROOT / "installers" / "linux"


def pick_python() -> str:
    """The distro's python3 when it has PyGObject and venv (a typical desktop), else this one."""
    system = "/usr/bin/python3"
    if os.path.exists(system):
        ok = subprocess.run(
            [system, "-c", "import gi, venv, sys; sys.exit(sys.version_info < (3, 11))"], capture_output=True
        )
        if ok.returncode == 0:
            return system
    return sys.executable


def has_gi(python: str) -> bool:
    return subprocess.run([python, "-c", "import gi"], capture_output=True).returncode == 0


def test_scripts_are_valid_sh():
    for script in ("install.sh", "uninstall.sh"):
        path = LINUX / script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        assert subprocess.run(["sh", "-n", str(path)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", "-s", "sh", *map(str, LINUX.glob("*.sh"))], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_install_help_and_bad_options():
    out = subprocess.run(["sh", str(LINUX / "install.sh"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--systemd" in out.stdout and "never turns on" in out.stdout
    bad = subprocess.run(["sh", str(LINUX / "install.sh"), "--frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown option --frobnicate" in bad.stderr
    norepo = subprocess.run(["sh", str(LINUX / "install.sh"), "--repo", "/nonexistent"], capture_output=True, text=True)
    assert norepo.returncode == 1 and "no pyproject.toml" in norepo.stderr


def checkout_copy(tmp_path: Path) -> Path:
    """This checkout's files as git knows them (committed or not), in a fresh folder."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    repo = tmp_path / "checkout"
    for rel in listed.stdout.splitlines():
        source = ROOT / rel
        if source.is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / rel)
    return repo


def install_env(home: Path, **extra: str) -> dict[str, str]:
    """A desktop user's environment for the install scripts: a fresh HOME, the system PATH, and the caches of
    this machine (pip's, and installers/install.py's llama-cpp-python wheel for its backend, built once beside
    pip's), so a test run outside .ci/run, which exports LMSP_WHEEL_CACHE, does not compile llama.cpp again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), PATH="/usr/local/bin:/usr/bin:/bin", **extra)
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout.strip()
    if cache:
        env["PIP_CACHE_DIR"] = cache
        env["LMSP_WHEEL_CACHE"] = os.environ.get("LMSP_WHEEL_CACHE") or str(Path(cache).parent / "lmsp-tray" / "wheels")
    return env


def test_linux_install_then_uninstall_for_real(tmp_path, tiny_gguf):
    """install.sh into a temp HOME: venv, package, launcher, icons, systemd unit; idempotent; uninstall.sh
    stops a running instance first and keeps the models people put in the models folder."""
    home = tmp_path / "home with space"
    home.mkdir()
    repo = checkout_copy(tmp_path)
    env = install_env(home)
    python = pick_python()

    first = subprocess.run(
        ["sh", str(repo / "installers" / "linux" / "install.sh"), "--python", python, "--systemd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    print(first.stdout[-3000:], first.stderr[-3000:])
    assert first.returncode == 0
    # The checkout is left as it was (the package is built from a temporary copy).
    assert not (repo / "build").exists() and not list(repo.glob("*.egg-info"))
    assert "the demo model (Gemma 3 270M) is installed" in first.stdout

    data = home / ".local" / "share"
    venv = data / "lmsp-tray" / "venv"
    program = venv / "bin" / "lmsp-tray"
    assert program.is_file() and os.access(program, os.X_OK)
    # The venv's own copy of the package (not this checkout) imports, with the tray parts.
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import lmsp_tray, lmsp_tray.desktop.tray, lmsp_tray.desktop.autostart, lmsp_tray.desktop.menu; print(lmsp_tray.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(venv))
    if has_gi(python):
        assert subprocess.run([str(venv / "bin" / "python"), "-c", "import gi"], cwd=tmp_path).returncode == 0
    link = home / ".local" / "bin" / "lmsp-tray"
    assert link.is_symlink() and link.resolve() == program.resolve()

    # The launcher, as a desktop reads it (GIO).
    launcher = data / "applications" / "lmsp-tray.desktop"
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(launcher)
    entry = parser["Desktop Entry"]
    assert entry["Icon"] == "lmsp-tray" and entry["Terminal"] == "false"
    if shutil.which("desktop-file-validate"):
        valid = subprocess.run(["desktop-file-validate", str(launcher)], capture_output=True, text=True)
        assert valid.returncode == 0 and "error" not in valid.stdout + valid.stderr, valid.stdout + valid.stderr
    assert (data / "icons" / "hicolor" / "256x256" / "apps" / "lmsp-tray.png").is_file()
    if has_gi(sys.executable):
        import gi

        gi.require_version("Gio", "2.0")
        from gi.repository import Gio, GLib

        info = Gio.DesktopAppInfo.new_from_filename(str(launcher))  # None if TryExec= did not find it
        assert info is not None
        ok, argv = GLib.shell_parse_argv(info.get_commandline())  # how GIO splits Exec= to launch it
        assert ok and argv == [str(program)]  # the space in HOME survives the quoting
    unit = home / ".config" / "systemd" / "user" / "lmsp-tray.service"
    text = unit.read_text()
    assert f'ExecStart="{program}" serve' in text and "WantedBy=default.target" in text
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env)
        assert verify.returncode == 0, verify.stderr
    # Start at login stays off.
    assert not (home / ".config" / "autostart").exists()
    assert "start at login is off" in first.stdout

    again = subprocess.run(
        ["sh", str(repo / "installers" / "linux" / "install.sh"), "--python", python, "--no-demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert again.returncode == 0, again.stderr
    assert f"reusing {venv}" in again.stdout and program.is_file()

    # The installed program runs: bare `lmsp-tray` without a display says so in one line and serves.
    check_installed_program_serves(program, env, tmp_path, tiny_gguf)

    (home / ".config" / "autostart").mkdir(parents=True)
    (home / ".config" / "autostart" / "lmsp-tray.desktop").write_text("[Desktop Entry]\n")
    models = data / "lmsp-tray" / "models"  # the folder the tray tells people to use
    models.mkdir(exist_ok=True)
    mine = models / "my-own-model.gguf"
    shutil.copy(tiny_gguf, mine)
    (models / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF stand-in for the assembled demo model")

    # Uninstall while lmsp-tray runs: it is stopped first (cleanly), not left running from a deleted venv.
    running = start_installed_program(program, env, tmp_path)
    gone = subprocess.run(["sh", str(LINUX / "uninstall.sh")], env=env, capture_output=True, text=True, timeout=180)
    assert gone.returncode == 0, gone.stderr
    assert running.wait(30) == 0 and "stopped lmsp-tray" in gone.stderr
    for path in (
        venv,
        link,
        launcher,
        unit,
        home / ".config" / "autostart" / "lmsp-tray.desktop",
        data / "icons" / "hicolor" / "256x256" / "apps" / "lmsp-tray.png",
    ):
        assert not path.exists() and not path.is_symlink(), path
    assert mine.is_file() and "kept your settings and data" in gone.stdout
    # --purge removes settings and lmsp-tray's own data, the demo model too, never the models people put there.
    purge = subprocess.run(["sh", str(LINUX / "uninstall.sh"), "--purge"], env=env, capture_output=True, text=True)
    assert purge.returncode == 0, purge.stderr
    assert mine.is_file() and sorted(p.name for p in (data / "lmsp-tray").iterdir()) == ["models"]
    assert [p.name for p in models.iterdir()] == [mine.name]
    assert f"kept 1 file(s) in {models} (your models; --delete-models removes them)" in purge.stdout
    assert not (home / ".config" / "lmsp-tray").exists()
    # Only a separately named flag deletes them.
    delete = subprocess.run(
        ["sh", str(LINUX / "uninstall.sh"), "--purge", "--delete-models"], env=env, capture_output=True, text=True
    )
    assert delete.returncode == 0 and not (data / "lmsp-tray").exists()


def start_installed_program(program: Path, env: dict[str, str], tmp_path: Path) -> subprocess.Popen:
    """The installed program, headless, in the install's home; returns once it serves."""
    run_env = {k: v for k, v in env.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    home = Path(run_env["HOME"])
    with (tmp_path / "running.log").open("w") as out:
        proc = subprocess.Popen(
            [str(program), "serve", "--port", "0", "--no-default-dirs"],
            env=run_env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def written() -> bool:
        assert proc.poll() is None, (tmp_path / "running.log").read_text()
        return bool(list(home.rglob("service.json")))

    wait_until(written, 120, "the installed program to write service.json", interval=0.1)
    return proc


def check_installed_program_serves(program: Path, env: dict[str, str], tmp_path: Path, model: Path) -> None:
    """Start the installed `lmsp-tray` (headless: no DISPLAY), check GET /lmsp/v1 and /models, SIGTERM it."""
    models = tmp_path / "installed-models"
    models.mkdir()
    (models / model.name).symlink_to(model)
    run_env = {k: v for k, v in env.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    home = Path(run_env["HOME"])
    log = tmp_path / "installed.log"
    token = cli_token([str(program)], run_env, "models:read", cwd=tmp_path)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(program), "--port", "0", "--models-dir", str(models), "--no-default-dirs"],
            env=run_env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def written() -> str | None:
            assert proc.poll() is None, log.read_text()
            for found in home.rglob("service.json"):  # where the platform's folders put it
                return json.loads(found.read_text())["url"]
            return None

        url = wait_until(
            written,
            120,
            "the installed program to write service.json",
            interval=0.1,
            ignoring=(OSError, ValueError, KeyError),
        )
        with urllib.request.urlopen(url, timeout=30) as reply:
            doc = json.loads(reply.read())
        assert doc["object"] == "service" and doc["service"]["name"] == "lmsp-tray"
        request = urllib.request.Request(url + "/models", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            ids = [m["id"] for m in json.loads(reply.read())["data"]]
        assert ids == ["tiny-test:1m-f32"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    headless = [line for line in text.splitlines() if "running headless" in line]
    assert len(headless) == 1 and "no display" in headless[0] and url in headless[0], text
    assert "Traceback" not in text
    assert not list(home.rglob("service.json"))  # removed on exit


def test_desktop_and_unit_templates():
    desktop = (LINUX / "lmsp-tray.desktop").read_text()
    assert "Exec=@EXEC@" in desktop and "TryExec=@TRYEXEC@" in desktop and "Type=Application" in desktop
    unit = (LINUX / "lmsp-tray.service").read_text()
    assert "ExecStart=@EXEC@ serve" in unit and "UnsetEnvironment=DISPLAY WAYLAND_DISPLAY" in unit


def test_macos_launch_agent_template_is_what_autostart_writes(tmp_path):
    program = "/Applications/lmsp-tray.app/Contents/MacOS/lmsp-tray"
    logs = "/Users/ann/Library/Logs"
    text = (ROOT / "installers" / "macos" / "dev.lmsp-tray.plist").read_text()
    doc = plistlib.loads(text.replace("@PROGRAM@", program).replace("@LOGS@", logs).encode())
    assert doc == LaunchAgent(tmp_path, Path(logs)).document([program])


def test_pyinstaller_specs_compile_and_name_existing_files():
    """The three specs share one analysis (the Linux build proves it: tests/e2e/test_pyinstaller.py)."""
    for name in ("linux", "macos", "windows"):
        spec = ROOT / "installers" / name / "lmsp-tray.spec"
        source = spec.read_text()
        compile(source, str(spec), "exec")
        assert "from pyinstaller_common import analysis_inputs" in source and "**analysis_inputs(ROOT, " in source
        assert "hiddenimports=" not in source and "datas=" not in source  # nothing listed apart from the shared one
        for rel in re.findall(r'ROOT / "([^"]+)" / "([^"]+)"', source):
            assert (ROOT.joinpath(*rel)).exists(), f"{spec.name} names missing {'/'.join(rel)}"
    mac = (ROOT / "installers" / "macos" / "lmsp-tray.spec").read_text()
    assert '"LSUIElement": True' in mac and "BUNDLE(" in mac and 'bundle_identifier="dev.lmsp-tray"' in mac


def test_inno_setup_script():
    iss = ROOT / "installers" / "windows" / "lmsp-tray.iss"
    text = iss.read_text()
    assert "PrivilegesRequired=lowest" in text
    for source in re.findall(r'Source: "([^"]+)"', text) + re.findall(r"SetupIconFile=(\S+)", text):
        if "dist" in source:
            continue  # built by PyInstaller first
        assert (iss.parent / source.replace("\\", "/")).resolve().exists(), source
    # The installer never turns start at login on: Run-key lines only delete on uninstall.
    for line in text.splitlines():
        if "CurrentVersion\\Run" in line or "StartupApproved" in line:
            if line.lstrip().startswith(";"):
                continue
            assert "ValueType: none" in line and "uninsdeletevalue" in line


def test_linux_install_with_prefix_puts_everything_under_it(tmp_path):
    """--prefix layout (package only: LMSP_TRAY_PIP_ARGS=--no-deps keeps this quick)."""
    home = tmp_path / "home"
    home.mkdir()
    prefix = tmp_path / "pfx"
    env = install_env(home, LMSP_TRAY_PIP_ARGS="--no-deps")
    out = subprocess.run(
        ["sh", str(LINUX / "install.sh"), "--python", pick_python(), "--prefix", str(prefix), "--systemd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    program = prefix / "share" / "lmsp-tray" / "venv" / "bin" / "lmsp-tray"
    assert program.is_file()
    assert (prefix / "bin" / "lmsp-tray").resolve() == program.resolve()
    assert f"Exec={program}" in (prefix / "share" / "applications" / "lmsp-tray.desktop").read_text()
    assert (prefix / "config" / "systemd" / "user" / "lmsp-tray.service").is_file()
    assert "not enabling the unit" in out.stdout
    assert sorted(p.name for p in home.iterdir()) in ([], [".cache"])  # nothing else lands in HOME
    gone = subprocess.run(
        ["sh", str(LINUX / "uninstall.sh"), "--prefix", str(prefix)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gone.returncode == 0 and not program.exists() and not (prefix / "bin" / "lmsp-tray").exists()
