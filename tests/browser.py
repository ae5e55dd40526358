"""A real browser for the console tests: Debian's chromium driven by Playwright.

Playwright's own browser download cannot work here (and must not be needed): the system's
chromium is launched by path. `.ci/run` installs it with apt.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "console"
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 400, "height": 800}


def chromium_path() -> str | None:
    for candidate in (os.environ.get("LMSP_TEST_CHROMIUM"), "/usr/lib/chromium/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium per test module. Not per session: while Playwright's sync API is open it keeps an
    event loop running on the main thread, and later tests that call asyncio.run() there would fail."""
    path = chromium_path()
    if path is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def screenshot(page: Any, name: str) -> Path:
    """Save the page as test-artifacts/console/<name>-<width>x<height>.png (looked at by people)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    path = ARTIFACTS / f"{name}-{size['width']}x{size['height']}.png"
    page.screenshot(path=str(path))
    return path


UNLABELLED_CONTROLS = """
() => [...document.querySelectorAll("input, select, textarea, button, a[href], summary")]
  .filter((el) => el.offsetParent !== null || el.getClientRects().length)
  .filter((el) => {
    const labelled = (el.labels && [...el.labels].some((l) => l.textContent.trim()))
      || (el.getAttribute("aria-label") || "").trim()
      || (el.getAttribute("aria-labelledby") && document.getElementById(el.getAttribute("aria-labelledby")))
      || (["BUTTON", "A", "SUMMARY"].includes(el.tagName) && el.textContent.trim());
    return !labelled;
  })
  .map((el) => el.outerHTML.slice(0, 120))
"""
