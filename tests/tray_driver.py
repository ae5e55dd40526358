"""Drives one tray process under Xvfb: reads its dumped Gtk menu, clicks and types into it.

The process (tests/tray_runner.py, or the real `lmsp-tray` with
tests/probe_site on PYTHONPATH) writes `menu.json` into its state folder
(tests/gtk_probe.py); `TrayProcess` reads it, finds the tray icon, opens the
menu with a right-click and walks it with the keyboard (xdotool), takes
screenshots and measures the icon's colours in them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from support import json_lines, wait_until
from xvfb import XSession

from lmsp_tray.desktop.icons import COLOURS

TIMEOUT = 30


class TrayProcess:
    """One tray process and what it reports (`state_dir/menu.json`, `events.jsonl`)."""

    def __init__(self, x: XSession, state_dir: Path, argv: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self.x = x
        self.dir = state_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.output = self.dir / "output.txt"
        self._out = self.output.open("w")
        self.proc = subprocess.Popen(
            list(argv), env=env, cwd=cwd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started = time.monotonic()

    # -- observing --------------------------------------------------------------------------------
    def menu(self) -> dict:
        try:
            return json.loads((self.dir / "menu.json").read_text())
        except (OSError, ValueError):
            return {}

    def events(self) -> list[dict]:
        return json_lines(self.dir / "events.jsonl")

    def wait_event(self, event: str, arg: object = None) -> dict:
        def found():
            return next((e for e in self.events() if e["event"] == event and (arg is None or e["arg"] == arg)), None)

        return wait_until(found, TIMEOUT, f"backend event {event} {arg or ''}", ignoring=Exception)

    def item(self, *path: str, menu: dict | None = None) -> dict | None:
        items = (menu or self.menu()).get("items", [])
        entry = None
        for prefix in path:
            entry = next((i for i in items if not i.get("separator") and i["text"].startswith(prefix)), None)
            if entry is None:
                return None
            items = entry.get("submenu", [])
        return entry

    @staticmethod
    def _checked(item, check):
        return item if item is not None and check(item) else None

    def wait_item(self, *path: str, check=lambda item: True, what: str = "") -> dict:
        return wait_until(
            lambda: self._checked(self.item(*path), check),
            TIMEOUT,
            what or f"menu item {' > '.join(path)}",
            ignoring=Exception,
        )

    # -- acting -----------------------------------------------------------------------------------
    def icon_window(self) -> int:
        # The program starts its service first (a model process pool, the store): on a loaded
        # machine that alone has taken over 30 s, so the icon gets twice the usual wait.
        return wait_until(self.x.tray_icons, 2 * TIMEOUT, "the tray icon to be embedded", ignoring=Exception)[0]

    def open_menu(self) -> None:
        assert not self.menu().get("open")
        self.x.click(self.icon_window(), 3)
        wait_until(lambda: self.menu().get("open"), TIMEOUT, "the menu to open", ignoring=Exception)
        wait_until(self.x.popup_windows, TIMEOUT, "the menu window to be mapped", ignoring=Exception)
        time.sleep(0.2)  # let the pointer/keyboard grab settle before typing

    def keys_to(self, *path: str) -> list[str]:
        """Keys that select `path` in the open menu (insensitive items and separators are skipped)."""
        keys: list[str] = []
        items = self.menu()["items"]
        for depth, prefix in enumerate(path):
            selectable = [i for i in items if not i.get("separator") and i["sensitive"]]
            index = next(n for n, i in enumerate(selectable) if i["text"].startswith(prefix))
            # At the top nothing is selected yet; entering a submenu selects its first item.
            keys += ["Down"] * (index + 1 if depth == 0 else index)
            items = selectable[index].get("submenu", [])
            if depth < len(path) - 1:
                keys.append("Right")
        return keys

    def choose(self, *path: str, screenshot: str | None = None, closes: bool = True) -> None:
        self.open_menu()
        keys = self.keys_to(*path)
        self.x.keys(*keys)
        if screenshot:
            time.sleep(0.3)
            self.x.screenshot(screenshot)
        self.x.keys("Return")
        if closes:
            wait_until(lambda: not self.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)

    def show(self, *path: str, screenshot: str) -> None:
        """Open the menu, walk to `path` (submenus open), screenshot, close it again."""
        self.open_menu()
        keys = self.keys_to(*path)
        self.x.keys(*(keys + ["Right"] if self.item(*path).get("submenu") is not None else keys))
        time.sleep(0.3)
        self.x.screenshot(screenshot)
        for _ in range(len(path) + 1):
            if not self.menu().get("open"):
                break
            self.x.keys("Escape")
            time.sleep(0.2)
        wait_until(lambda: not self.menu().get("open"), TIMEOUT, "the menu to close", ignoring=Exception)

    def icon_colour_share(self, shot: Path, activity: str) -> float:
        """Share of the icon window's pixels in the tile colour of `activity`.

        Also saves the icon's surroundings, enlarged 4x, next to the screenshot (`*-zoom.png`).
        """
        from PIL import Image

        geo = self.x.geometry(self.icon_window())
        with Image.open(shot) as image:
            crop = image.convert("RGB").crop(geo.box())
            around = image.convert("RGB").crop(geo.box(pad=8))
        around.resize((around.width * 4, around.height * 4), Image.Resampling.NEAREST).save(
            shot.with_name(shot.stem + "-zoom.png")
        )
        fill = COLOURS[activity][0]
        raw = crop.tobytes()
        pixels = [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]
        return sum(1 for p in pixels if p == fill) / len(pixels)

    def wait_icon_colour(self, name: str, activity: str, share: float = 0.3) -> Path:
        """Screenshot `name`, again until the icon's pixels are more than `share` in the colour of `activity`.

        The dumped "activity" (and "embedded") change before the icon is painted: the tray picks the image on
        its poll thread, GTK sets it on its main loop later, and the X server paints it after that.
        """

        def painted() -> Path | None:
            shot = self.x.screenshot(name)
            return shot if self.icon_colour_share(shot, activity) > share else None

        return wait_until(painted, TIMEOUT, f"the {activity} icon painted in the tray ({name})", ignoring=Exception)

    def wait_exit(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session only
            self.proc.wait(10)
        self._out.close()

    def text_written(self) -> str:
        parts = [self.output.read_text(errors="replace")]
        for name in ("tray.log", "menu.json", "events.jsonl"):
            path = self.dir / name
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)


def shown(items: list[dict]) -> list:
    """The dumped Gtk menu as (text, sensitive, checked, submenu) tuples."""
    return [
        ("---",)
        if i.get("separator")
        else (i["text"], i["sensitive"], i["checked"], shown(i["submenu"]) if "submenu" in i else None)
        for i in items
    ]


def as_shown(specs) -> list:
    """What pystray's gtk backend should show for `specs`."""
    out = []
    for s in specs:
        if s.separator:
            out.append(("---",))
        elif s.submenu is not None:
            out.append((s.text, s.enabled, s.checked, as_shown(s.submenu)))
        else:
            out.append((s.text, s.enabled and s.action is not None, s.checked, None))
    return out
