"""One "is there a display" check, for the tray (icon or headless) and for opening a browser."""

from __future__ import annotations

import sys

import pytest

from lmsp_tray import console_link
from lmsp_tray.desktop import system
from lmsp_tray.display import display_available


def test_one_check_for_the_tray_and_the_browser() -> None:
    assert system.display_available is display_available
    assert console_link.display_available is display_available


@pytest.mark.skipif(sys.platform in ("darwin", "win32", "cygwin"), reason="these always have a display")
def test_a_browser_needs_a_display_or_a_browser_command() -> None:
    assert not console_link.browser_possible({})
    assert console_link.browser_possible({"WAYLAND_DISPLAY": "wayland-0"})
    assert console_link.browser_possible({"DISPLAY": ":0"})
    assert console_link.browser_possible({"BROWSER": "w3m"})  # a text browser in this terminal
    assert not display_available({"BROWSER": "w3m"})  # but no tray icon for it
