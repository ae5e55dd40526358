"""Start lmsp-tray at login: one small backend per OS, off unless the user turns it on.

- Linux and other XDG desktops: `$XDG_CONFIG_HOME/autostart/lmsp-tray.desktop`
  (`~/.config` when the variable is unset or not absolute).
- macOS: the LaunchAgent `~/Library/LaunchAgents/dev.lmsp-tray.plist`.
- Windows: the value `lmsp-tray` under `HKCU\\Software\\Microsoft\\Windows\\
  CurrentVersion\\Run`, written through a thin `Registry` interface (so the
  backend is testable anywhere); a "disabled" mark that Task Manager leaves
  under `...\\Explorer\\StartupApproved\\Run` is honoured by `status` and
  cleared by `enable`.

Nothing here runs on import or on its own: `lmsp-tray autostart
enable|disable|status` (via `autostart_command`) and the tray's "Start at
login" checkbox are the only callers. The command registered is the one that
started this program (`launch_command`).
"""

from __future__ import annotations

import configparser
import os
import plistlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lmsp_tray.private import write_private

APP_ID = "lmsp-tray"
DESKTOP_FILE = "lmsp-tray.desktop"
LAUNCH_AGENT_LABEL = "dev.lmsp-tray"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
APPROVED_KEY = r"Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\Run"
ACTIONS = ("enable", "disable", "status")
LOGIN_ITEM_MODE = 0o644  # a login item (.desktop, LaunchAgent plist) is read by the session, as usual


class AutostartError(Exception):
    """Autostart could not be read or changed (a clear message, never a traceback)."""


@dataclass(frozen=True)
class AutostartStatus:
    supported: bool
    enabled: bool
    mechanism: str  # "XDG autostart", "LaunchAgent", "Windows Run key", or "unsupported"
    location: str  # the file, or the registry key and value name
    command: tuple[str, ...] | None = None  # the registered command line, when enabled
    note: str | None = None  # e.g. "turned off in Task Manager"


# -- the command to register ----------------------------------------------------------------------


def launch_command(
    args: Sequence[str] = (),
    *,
    frozen: bool | None = None,
    executable: str | None = None,
    platform: str | None = None,
) -> list[str]:
    """How to start this same installation again at login.

    The frozen executable when frozen; else the `lmsp-tray` console script
    next to the interpreter (a venv's `bin/`); else `python -m lmsp_tray`.
    On Windows `pythonw.exe -m lmsp_tray` is preferred to the console
    script, which would open a console window at every login.
    """
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    exe = Path(executable or sys.executable).absolute()  # not resolved: a venv's python is a symlink
    platform = platform or sys.platform
    if frozen:
        return [str(exe), *args]
    bindir = exe.parent
    if platform == "win32":
        pythonw = bindir / "pythonw.exe"
        if pythonw.is_file():
            return [str(pythonw), "-m", "lmsp_tray", *args]
        for script in (bindir / "lmsp-tray.exe", bindir / "Scripts" / "lmsp-tray.exe"):
            if script.is_file():
                return [str(script), *args]
    else:
        script = bindir / APP_ID
        if script.is_file() and os.access(script, os.X_OK):
            return [str(script), *args]
    return [str(exe), "-m", "lmsp_tray", *args]


# -- backends -------------------------------------------------------------------------------------


class AutostartBackend(Protocol):
    mechanism: str

    def location(self) -> str: ...

    def read(self) -> AutostartStatus: ...

    def write(self, command: Sequence[str]) -> None: ...

    def remove(self) -> bool:
        """Remove the entry; False when there was none."""
        ...


# XDG Desktop Entry quoting: https://specifications.freedesktop.org/desktop-entry-spec/ (Exec key)
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")
_ESCAPE_IN_QUOTES = set('"`$\\')


def desktop_exec(argv: Sequence[str]) -> str:
    """An Exec= value (already string-escaped for the file) that runs `argv` exactly."""
    words = []
    for arg in argv:
        arg = arg.replace("%", "%%")
        if arg and not (set(arg) & _RESERVED):
            words.append(arg)
        else:
            words.append('"' + "".join("\\" + c if c in _ESCAPE_IN_QUOTES else c for c in arg) + '"')
    # The general string escaping of .desktop values then doubles every backslash.
    return " ".join(words).replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def desktop_string(value: str) -> str:
    """A plain string value for a .desktop file (TryExec=, Name=...): escapes only, no quoting."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def parse_desktop_exec(value: str) -> list[str]:
    """The argv an Exec= value (as written in the file) stands for; inverse of `desktop_exec`."""
    unescaped, i = [], 0
    while i < len(value):  # general string escapes first
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            unescaped.append({"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}.get(nxt, "\\" + nxt))
            i += 2
            continue
        unescaped.append(c)
        i += 1
    text = "".join(unescaped)
    args: list[str] = []
    current: list[str] | None = None
    quoted = False
    i = 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPE_IN_QUOTES:
                current.append(text[i + 1])  # type: ignore[union-attr]
                i += 2
                continue
            if c == '"':
                quoted = False
            else:
                current.append(c)  # type: ignore[union-attr]
        elif c == '"':
            quoted = True
            current = current if current is not None else []
        elif c in " \t\n":
            if current is not None:
                args.append("".join(current))
                current = None
        else:
            current = current if current is not None else []
            current.append(c)
        i += 1
    if current is not None:
        args.append("".join(current))
    return [a.replace("%%", "%") for a in args]


class XDGAutostart:
    """`lmsp-tray.desktop` in the XDG autostart folder."""

    mechanism = "XDG autostart"

    def __init__(self, config_home: Path) -> None:
        self.path = Path(config_home) / "autostart" / DESKTOP_FILE

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], home: Path) -> XDGAutostart:
        configured = environ.get("XDG_CONFIG_HOME", "")
        base = Path(configured) if configured and os.path.isabs(configured) else home / ".config"
        return cls(base)

    def location(self) -> str:
        return str(self.path)

    def read(self) -> AutostartStatus:
        off = AutostartStatus(True, False, self.mechanism, self.location())
        if not self.path.is_file():
            return off
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
        try:
            parser.read_string(self.path.read_text(encoding="utf-8"))
            entry = parser["Desktop Entry"]
        except (OSError, UnicodeDecodeError, configparser.Error, KeyError) as exc:
            raise AutostartError(f"cannot read {self.path}: {exc}") from None
        command = tuple(parse_desktop_exec(entry.get("Exec", "")))
        if entry.get("Hidden", "false").strip().lower() == "true":
            return AutostartStatus(True, False, self.mechanism, self.location(), command, "marked Hidden")
        if entry.get("X-GNOME-Autostart-enabled", "true").strip().lower() == "false":
            return AutostartStatus(
                True, False, self.mechanism, self.location(), command, "turned off in the desktop's startup settings"
            )
        return AutostartStatus(True, True, self.mechanism, self.location(), command)

    def write(self, command: Sequence[str]) -> None:
        lines = [
            "[Desktop Entry]",
            "Type=Application",
            "Name=lmsp-tray",
            "GenericName=Local model server",
            "Comment=Serve local GGUF models over LMSP from the system tray",
            f"Exec={desktop_exec(command)}",
        ]
        if os.path.isabs(command[0]):
            lines.append(f"TryExec={desktop_string(command[0])}")  # a path, not an Exec command line
        lines += [
            "Icon=lmsp-tray",
            "Terminal=false",
            "Categories=Utility;Development;",
            "X-GNOME-Autostart-enabled=true",
            "X-GNOME-Autostart-Delay=5",
            "",
        ]
        _write_atomic(self.path, "\n".join(lines).encode("utf-8"))

    def remove(self) -> bool:
        return _remove(self.path)


class LaunchAgent:
    """`~/Library/LaunchAgents/dev.lmsp-tray.plist`: launchd starts it at the next login."""

    mechanism = "LaunchAgent"

    def __init__(self, agents_dir: Path, logs_dir: Path | None = None, label: str = LAUNCH_AGENT_LABEL) -> None:
        self.label = label
        self.path = Path(agents_dir) / f"{label}.plist"
        self.logs_dir = logs_dir

    def location(self) -> str:
        return str(self.path)

    def document(self, command: Sequence[str]) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "Label": self.label,
            "ProgramArguments": list(command),
            "RunAtLoad": True,
            "KeepAlive": False,
            "ProcessType": "Interactive",
            "LimitLoadToSessionType": "Aqua",
        }
        if self.logs_dir is not None:
            doc["StandardOutPath"] = str(self.logs_dir / "lmsp-tray.log")
            doc["StandardErrorPath"] = str(self.logs_dir / "lmsp-tray.log")
        return doc

    def read(self) -> AutostartStatus:
        if not self.path.is_file():
            return AutostartStatus(True, False, self.mechanism, self.location())
        try:
            doc = plistlib.loads(self.path.read_bytes())
        except (OSError, plistlib.InvalidFileException, ValueError) as exc:
            raise AutostartError(f"cannot read {self.path}: {exc}") from None
        args = doc.get("ProgramArguments") if isinstance(doc, dict) else None
        command = tuple(str(a) for a in args) if isinstance(args, list) else None
        if doc.get("Disabled") is True:
            return AutostartStatus(True, False, self.mechanism, self.location(), command, "marked Disabled")
        return AutostartStatus(True, bool(command), self.mechanism, self.location(), command)

    def write(self, command: Sequence[str]) -> None:
        _write_atomic(self.path, plistlib.dumps(self.document(command), fmt=plistlib.FMT_XML))

    def remove(self) -> bool:
        return _remove(self.path)


def _remove(path: Path) -> bool:
    """Delete an autostart file; False when there was none."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise AutostartError(f"cannot remove {path}: {exc.strerror or exc}") from None


class Registry(Protocol):
    """The few HKEY_CURRENT_USER operations the Windows backend needs."""

    def get_value(self, key: str, name: str) -> Any | None: ...

    def set_string(self, key: str, name: str, value: str) -> None: ...

    def delete_value(self, key: str, name: str) -> bool: ...


class WinregRegistry:
    """`Registry` over `winreg`, HKEY_CURRENT_USER only (Windows)."""

    def __init__(self) -> None:
        import winreg

        self._winreg = winreg

    def get_value(self, key: str, name: str) -> Any | None:
        w = self._winreg
        try:
            with w.OpenKey(w.HKEY_CURRENT_USER, key, 0, w.KEY_READ) as handle:
                return w.QueryValueEx(handle, name)[0]
        except FileNotFoundError:
            return None

    def set_string(self, key: str, name: str, value: str) -> None:
        w = self._winreg
        with w.CreateKeyEx(w.HKEY_CURRENT_USER, key, 0, w.KEY_SET_VALUE) as handle:
            w.SetValueEx(handle, name, 0, w.REG_SZ, value)

    def delete_value(self, key: str, name: str) -> bool:
        w = self._winreg
        try:
            with w.OpenKey(w.HKEY_CURRENT_USER, key, 0, w.KEY_SET_VALUE) as handle:
                w.DeleteValue(handle, name)
            return True
        except FileNotFoundError:
            return False


def split_windows_cmdline(line: str) -> list[str]:
    """argv from a command line, by the rules of CommandLineToArgvW (inverse of list2cmdline)."""
    args: list[str] = []
    current: list[str] = []
    have_arg = quoted = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            j = i
            while j < len(line) and line[j] == "\\":
                j += 1
            slashes = j - i
            if j < len(line) and line[j] == '"':
                current.append("\\" * (slashes // 2))
                if slashes % 2:
                    current.append('"')
                    j += 1
                i = j
            else:
                current.append("\\" * slashes)
                i = j
            have_arg = True
            continue
        if c == '"':
            quoted = not quoted
            have_arg = True
        elif c in " \t" and not quoted:
            if have_arg:
                args.append("".join(current))
                current, have_arg = [], False
        else:
            current.append(c)
            have_arg = True
        i += 1
    if have_arg:
        args.append("".join(current))
    return args


class WindowsRun:
    """The `lmsp-tray` value under HKCU\\...\\CurrentVersion\\Run."""

    mechanism = "Windows Run key"

    def __init__(self, registry: Registry, name: str = APP_ID) -> None:
        self.registry = registry
        self.name = name

    def location(self) -> str:
        return f"HKCU\\{RUN_KEY}\\{self.name}"

    def read(self) -> AutostartStatus:
        try:
            value = self.registry.get_value(RUN_KEY, self.name)
            approved = self.registry.get_value(APPROVED_KEY, self.name)
        except OSError as exc:
            raise AutostartError(f"cannot read {self.location()}: {exc}") from None
        if not isinstance(value, str) or not value.strip():
            return AutostartStatus(True, False, self.mechanism, self.location())
        command = tuple(split_windows_cmdline(value))
        if isinstance(approved, (bytes, bytearray)) and approved and approved[0] & 1:
            return AutostartStatus(True, False, self.mechanism, self.location(), command, "turned off in Task Manager")
        return AutostartStatus(True, True, self.mechanism, self.location(), command)

    def write(self, command: Sequence[str]) -> None:
        try:
            self.registry.set_string(RUN_KEY, self.name, subprocess.list2cmdline(list(command)))
            self.registry.delete_value(APPROVED_KEY, self.name)  # the user asked: lift a Task Manager "off"
        except OSError as exc:
            raise AutostartError(f"cannot write {self.location()}: {exc}") from None

    def remove(self) -> bool:
        try:
            removed = self.registry.delete_value(RUN_KEY, self.name)
            self.registry.delete_value(APPROVED_KEY, self.name)
        except OSError as exc:
            raise AutostartError(f"cannot remove {self.location()}: {exc}") from None
        return removed


class Unsupported:
    mechanism = "unsupported"

    def __init__(self, platform: str) -> None:
        self.platform = platform

    def location(self) -> str:
        return ""

    def read(self) -> AutostartStatus:
        return AutostartStatus(False, False, self.mechanism, "", note=f"not supported on {self.platform}")

    def write(self, command: Sequence[str]) -> None:
        raise AutostartError(f"start at login is not supported on {self.platform}")

    def remove(self) -> bool:
        return False


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, data, mode=LOGIN_ITEM_MODE)
    except OSError as exc:
        raise AutostartError(f"cannot write {path}: {exc.strerror or exc}") from None


# -- the facade -----------------------------------------------------------------------------------


class Autostart:
    """Start at login for this user; `enable` registers `launch_command()` unless told otherwise."""

    def __init__(self, backend: AutostartBackend, command: Sequence[str] | None = None) -> None:
        self.backend = backend
        self._command = list(command) if command is not None else None

    @classmethod
    def for_platform(
        cls,
        platform: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        registry: Registry | None = None,
        command: Sequence[str] | None = None,
    ) -> Autostart:
        platform = platform or sys.platform
        env = os.environ if environ is None else environ
        home = home if home is not None else Path(env.get("HOME") or Path.home())
        backend: AutostartBackend
        if platform == "darwin":
            backend = LaunchAgent(home / "Library" / "LaunchAgents", home / "Library" / "Logs")
        elif platform == "win32":
            backend = WindowsRun(registry if registry is not None else WinregRegistry())
        elif platform.startswith(("linux", "freebsd", "openbsd", "netbsd", "dragonfly", "sunos")):
            backend = XDGAutostart.from_environ(env, home)
        else:
            backend = Unsupported(platform)
        return cls(backend, command)

    @property
    def supported(self) -> bool:
        return not isinstance(self.backend, Unsupported)

    def command(self) -> list[str]:
        return list(self._command) if self._command is not None else launch_command()

    def status(self) -> AutostartStatus:
        return self.backend.read()

    def is_enabled(self) -> bool:
        try:
            return self.backend.read().enabled
        except AutostartError:
            return False

    def enable(self, command: Sequence[str] | None = None) -> AutostartStatus:
        argv = list(command) if command is not None else self.command()
        if not argv:
            raise AutostartError("no command to start at login")
        self.backend.write(argv)
        return self.backend.read()

    def disable(self) -> AutostartStatus:
        self.backend.remove()
        return self.backend.read()

    def set(self, enabled: bool) -> AutostartStatus:
        return self.enable() if enabled else self.disable()


def _shown(command: Sequence[str] | None) -> str:
    return subprocess.list2cmdline(list(command)) if command else "(nothing)"


def autostart_command(action: str, autostart: Autostart | None = None) -> tuple[int, str]:
    """`lmsp-tray autostart enable|disable|status`: (exit code, one message for the user).

    Exit codes: 0 done (status: always 0, the message says on or off),
    1 the OS refused (message says why), 2 bad action or unsupported platform.
    """
    if action not in ACTIONS:
        return 2, "usage: lmsp-tray autostart enable|disable|status"
    auto = autostart if autostart is not None else Autostart.for_platform()
    if not auto.supported and action != "status":
        return 2, f"Start at login is not supported on this platform ({sys.platform})."
    try:
        if action == "enable":
            st = auto.enable()
            if not st.enabled:
                return 1, f"Start at login was written to {st.location} but reads back as off ({st.note})."
            return 0, f"Start at login enabled ({st.mechanism}: {st.location}); it runs: {_shown(st.command)}"
        if action == "disable":
            before = auto.status()
            st = auto.disable()
            if st.enabled:
                return 1, f"Start at login is still on ({st.location})."
            if before.enabled or before.command:
                return 0, f"Start at login disabled (removed {st.location})."
            return 0, "Start at login was not enabled; nothing to do."
        st = auto.status()
    except AutostartError as exc:
        return 1, f"Could not {action} start at login: {exc}"
    if not st.supported:
        return 0, f"Start at login: not supported on this platform ({sys.platform})."
    if st.enabled:
        return 0, f"Start at login: enabled ({st.mechanism}: {st.location}); it runs: {_shown(st.command)}"
    extra = f" ({st.note})" if st.note else ""
    return 0, f"Start at login: disabled{extra}. Turn it on with `lmsp-tray autostart enable`."
