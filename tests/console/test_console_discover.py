"""Discover in the Models view, in a real browser against the fake Hub: a search lists GGUF repositories
with their figures, a repository's variants show size, fit and the vision projector, Download runs the
service's download task with its progress, and the model is listed when it is done."""

from __future__ import annotations

from browser import browser, open_console  # noqa: F401 - fixture
from hub_server import FakeHub
from hub_support import TINY, fake_hub, hf_env, home, hub, hub_daemon  # noqa: F401 - fixtures
from support import LiveDaemon, wait_until

PULLED = "tiny-hub:1m-q5_k_m"


def test_discover_search_variants_and_download(hub_daemon: LiveDaemon, hub: FakeHub, browser) -> None:
    console = open_console(hub_daemon, browser)
    page = console.page
    console.view("models")
    assert hub.searches == []  # opening the view asks nothing of the Hub
    page.locator(".discover summary").click()
    page.fill("#discover-search", "tiny")
    page.get_by_role("button", name="Search").click()
    repo = page.get_by_role("article", name=TINY, exact=True)
    repo.wait_for()
    assert "1,200 downloads" in (repo.text_content() or "") or "1200 downloads" in (repo.text_content() or "")
    assert "34 likes" in (repo.text_content() or "")
    repo.get_by_role("button", name="Show variants").click()
    q5 = repo.get_by_role("listitem", name="Q5_K_M")
    q5.wait_for()
    text = repo.text_content() or ""
    assert "Vision projector: mmproj" in text and "Q4_K_M (default)" in text and "Q8_0" in text
    assert "RAM" in (q5.text_content() or "") or "GPU" in (q5.text_content() or "")  # the fit summary
    q5.get_by_role("button", name="Download").click()
    wait_until(lambda: "Downloaded" in (q5.text_content() or ""), 60, "the download to finish")
    page.get_by_role("article", name=PULLED, exact=True).wait_for(timeout=15000)
    console.context.close()
    assert console.errors == []
