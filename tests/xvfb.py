"""A real X session for tray tests: Xvfb + the `trayer` tray host, driven with xdotool.

`XSession` starts Xvfb on a free display (`-displayfd`, so parallel runs do
not collide), waits until it answers, starts trayer and waits until it owns
the `_NET_SYSTEM_TRAY_S0` selection (python-xlib). Then a test starts the tray
program with `session.env`, finds the icon (the window carrying
`_XEMBED_INFO`), clicks it with xdotool, types keys into the open menu, and
takes screenshots with ImageMagick's `import` into `test-artifacts/`.

Needs the Debian packages xvfb, trayer, xdotool, imagemagick (see
/work/shared/testing/REAL-PARTS.md §2); `missing_tools()` says which are absent
so tests can skip with a reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TypeVar

from support import ROOT, wait_until

ARTIFACTS = ROOT / "test-artifacts"
TOOLS = ("Xvfb", "trayer", "xdotool", "import")

T = TypeVar("T")


def missing_tools() -> list[str]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    try:
        import Xlib.display  # noqa: F401
    except ImportError:
        missing.append("python-xlib")
    return missing


def spec_selectable(spec) -> bool:
    """Whether keyboard navigation stops at this `MenuItemSpec` in the real menu (as pystray builds it)."""
    if spec.separator:
        return False
    return spec.enabled if spec.submenu is not None else spec.enabled and spec.action is not None


def spec_keys(specs, *path: str) -> list[str]:
    """xdotool keys that walk an open Gtk menu built from `specs` to the item `path` (text prefixes).

    Nothing is selected when the menu opens, so the first Down selects the first selectable
    item; Right opens a submenu and selects its first item. Press Return afterwards.
    """
    keys: list[str] = []
    items = list(specs)
    for depth, prefix in enumerate(path):
        selectable = [s for s in items if spec_selectable(s)]
        index = next(n for n, s in enumerate(selectable) if s.text.startswith(prefix))
        keys += ["Down"] * (index + 1 if depth == 0 else index)
        items = list(selectable[index].submenu or ())
        if depth < len(path) - 1:
            keys.append("Right")
    return keys


@dataclass(frozen=True)
class Geometry:
    x: int
    y: int
    width: int
    height: int

    @property
    def centre(self) -> tuple[int, int]:
        return self.x + self.width // 2, self.y + self.height // 2

    def box(self, pad: int = 0) -> tuple[int, int, int, int]:
        return (max(self.x - pad, 0), max(self.y - pad, 0), self.x + self.width + pad, self.y + self.height + pad)


class XSession:
    """Xvfb + trayer. Use as a context manager; `env` is the environment for programs to test."""

    def __init__(
        self, width: int = 800, height: int = 600, artifacts: Path = ARTIFACTS, *, tray_host: bool = True
    ) -> None:
        self.width, self.height = width, height
        self.with_tray_host = tray_host
        self.artifacts = artifacts
        self.display_name = ""
        self._procs: list[subprocess.Popen] = []
        self._xlib = None
        self.log_dir: Path | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        try:
            xvfb = subprocess.Popen(
                [
                    "Xvfb",
                    "-displayfd",
                    str(write_fd),
                    "-screen",
                    "0",
                    f"{self.width}x{self.height}x24",
                    "-nolisten",
                    "tcp",
                    "-noreset",
                ],
                pass_fds=(write_fd,),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._procs.append(xvfb)
            os.close(write_fd)
            write_fd = -1
            number = b""
            deadline = time.monotonic() + 30
            while not number.endswith(b"\n"):
                chunk = os.read(read_fd, 16)
                if not chunk or time.monotonic() > deadline:
                    raise RuntimeError("Xvfb did not report its display number")
                number += chunk
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        self.display_name = f":{int(number.strip())}"
        wait_until(self._open_display, 30, f"X display {self.display_name}", ignoring=Exception)
        if self.with_tray_host:
            self.start_tray_host()

    def start_tray_host(self) -> None:
        """trayer, the X11 system tray (XEmbed); waits until it owns the tray selection."""
        trayer = subprocess.Popen(
            [
                "trayer",
                "--edge",
                "top",
                "--align",
                "right",
                "--widthtype",
                "request",
                "--height",
                "40",
                "--SetDockType",
                "true",
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._procs.append(trayer)
        wait_until(self.tray_host_ready, 30, "trayer to own _NET_SYSTEM_TRAY_S0", ignoring=Exception)

    def stop(self) -> None:
        if self._xlib is not None:
            try:
                self._xlib.close()
            except Exception:  # noqa: BLE001
                pass
            self._xlib = None
        for proc in reversed(self._procs):  # only the processes this session started
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self._procs.clear()

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("WAYLAND_DISPLAY", None)
        env.update(DISPLAY=self.display_name, NO_AT_BRIDGE="1", GDK_BACKEND="x11")
        return env

    # -- X queries (python-xlib) ------------------------------------------------------------------
    def _open_display(self):
        from Xlib import display as xdisplay

        if self._xlib is None:
            self._xlib = xdisplay.Display(self.display_name)
        return self._xlib

    def tray_host_ready(self) -> bool:
        from Xlib import X

        d = self._open_display()
        owner = d.get_selection_owner(d.intern_atom("_NET_SYSTEM_TRAY_S0"))
        return owner not in (X.NONE, 0) and bool(owner)

    def _walk(self, window):
        yield window
        try:
            children = window.query_tree().children
        except Exception:  # noqa: BLE001 - a window may vanish while we look
            return
        for child in children:
            yield from self._walk(child)

    def tray_icons(self) -> list[int]:
        """Ids of the windows embedded in the tray (they carry `_XEMBED_INFO`), mapped ones only."""
        from Xlib import X

        d = self._open_display()
        atom = d.intern_atom("_XEMBED_INFO")
        found = []
        for window in self._walk(d.screen().root):
            try:
                if window.get_full_property(atom, X.AnyPropertyType) is None:
                    continue
                if window.get_attributes().map_state != X.IsViewable:
                    continue
            except Exception:  # noqa: BLE001
                continue
            found.append(window.id)
        return found

    def geometry(self, window_id: int) -> Geometry:
        d = self._open_display()
        window = d.create_resource_object("window", window_id)
        geo = window.get_geometry()
        pos = window.translate_coords(d.screen().root, 0, 0)
        return Geometry(-pos.x, -pos.y, geo.width, geo.height)

    def popup_windows(self) -> list[Geometry]:
        """Mapped override-redirect top-level windows (open menus), largest first."""
        from Xlib import X

        d = self._open_display()
        found = []
        for window in d.screen().root.query_tree().children:
            try:
                attrs = window.get_attributes()
                if attrs.map_state != X.IsViewable or not attrs.override_redirect:
                    continue
                geo = window.get_geometry()
                if geo.width > 30 and geo.height > 30:
                    found.append(Geometry(geo.x, geo.y, geo.width, geo.height))
            except Exception:  # noqa: BLE001
                continue
        return sorted(found, key=lambda g: g.width * g.height, reverse=True)

    # -- input and output -------------------------------------------------------------------------
    def xdotool(self, *args: str) -> None:
        subprocess.run(
            ["xdotool", *args], env=self.env, check=True, timeout=30, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def click(self, window_id: int, button: int = 3) -> None:
        x, y = self.geometry(window_id).centre
        # One xdotool call (one X connection), so the server sees the move before the click.
        # (--sync is avoided: it waits ~15 s when the pointer is already there.)
        self.xdotool("mousemove", str(x), str(y), "click", str(button))

    def keys(self, *keys: str) -> None:
        if keys:
            self.xdotool("key", "--delay", "120", *keys)

    def screenshot(self, name: str) -> Path:
        path = self.artifacts / name
        subprocess.run(
            ["import", "-window", "root", str(path)],
            env=self.env,
            check=True,
            timeout=60,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        return path
