"""A real browser for the console tests: Debian's chromium driven by Playwright.

Playwright's own browser download cannot work here (and must not be needed): the system's
chromium is launched by path. `.ci/run` installs it with apt.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ROOT, LiveDaemon

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


@dataclass
class Console:
    live: LiveDaemon
    context: Any
    page: Any
    errors: list[str] = field(default_factory=list)

    def view(self, name: str) -> None:
        self.page.click(f"#nav a[data-view={name}]")
        self.page.wait_for_selector(f"#view-{name}:not([hidden])")

    def api(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.live.owner_token}"}
        return httpx.Client(base_url=self.live.url, headers=headers, timeout=60)


def open_console(live: LiveDaemon, browser: Any, viewport: dict[str, int] = WIDE) -> Console:
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    console = Console(live, context, page)
    page.on("pageerror", lambda e: console.errors.append(f"page error: {e}"))
    page.on("console", lambda m: console.errors.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(live.daemon.console_link())
    page.wait_for_selector("#nav:not([hidden])")
    return console


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
