"""The console page, driven through a real browser (Debian's chromium under Playwright) against a real
daemon with generated models: open it with a single-use code, chat with streaming and Stop, load and
unload, tokens, pairings, settings, and what another origin can and cannot do. Screenshots of each
view go to test-artifacts/console/."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import NARROW, UNLABELLED_CONTROLS, WIDE, Console, browser, open_console, screenshot  # noqa: F401 - fixture
from support import SLOW_ID, TINY_ID, LiveDaemon, wait_until

from lmsp_tray.auth.console import CONSOLE_SCOPES
from lmsp_tray.store import stored_responses

BROKEN = "half-downloaded.gguf"


@pytest.fixture
def console(daemon_factory, models_dir: Path, browser) -> Iterator[Console]:
    (models_dir / BROKEN).write_bytes(b"GGUF\x03\x00\x00\x00\x07")  # a truncated download
    live = daemon_factory()
    opened = open_console(live, browser)
    yield opened
    opened.context.close()
    assert opened.errors == [], "script errors or CSP violations in the page"


def assistant_text(page: Any) -> str:
    return page.locator(".msg.assistant .bubble.markdown").last.text_content() or ""


def set_sampling(page: Any, *, max_tokens: int, temperature: float = 0) -> None:
    page.click(".chat-settings summary")
    for selector, value in (("#chat-max-tokens", max_tokens), ("#chat-temperature", temperature)):
        page.fill(selector, str(value))
        page.locator(selector).dispatch_event("change")
    page.click(".chat-settings summary")


# -- opening --------------------------------------------------------------------------------------
def test_the_code_opens_the_console_and_leaves_no_trace(daemon_factory, browser) -> None:
    live = daemon_factory()
    link = live.daemon.console_link()
    code = link.split("#code=", 1)[1]
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    sent: list[tuple[str, str | None]] = []
    page.on("request", lambda r: sent.append((r.url, r.post_data)))
    page.goto(link)
    page.wait_for_selector("#nav:not([hidden])")
    assert page.url == live.base + "/console/"  # the fragment is gone from the address bar
    assert page.evaluate("location.hash") == ""
    assert all(url.startswith(live.base + "/") for url, _ in sent), "a request left the service's origin"
    assert not any(code in url for url, _ in sent), "the code went into a request line"
    assert [body for url, body in sent if url.endswith("/console/sessions")] == [
        json.dumps({"code": code}, separators=(",", ":"))
    ]
    assert context.cookies() == []  # no ambient credential at all: the token goes in a header
    token = json.loads(page.evaluate("sessionStorage.getItem('lmsp-tray.console.session')"))["token"]
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        me = [t for t in c.get("/auth/tokens").json()["data"] if t["name"] == "lmsp-tray console"]
        # its own token under Apps, with the scopes the page uses (tasks: the downloads Discover starts)
        assert len(me) == 1 and set(me[0]["scopes"]) == set(CONSOLE_SCOPES)
    page.reload()  # the session survives a reload of the tab
    page.wait_for_selector("#nav:not([hidden])")
    context.close()


def test_a_spent_or_expired_link_shows_how_to_open_the_console(daemon_factory, browser) -> None:
    live = daemon_factory()
    link = live.daemon.console_link()
    code = link.split("#code=", 1)[1]
    assert httpx.post(live.url + "/console/sessions", json={"code": code}, timeout=30).status_code == 201
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.goto(link)
    page.wait_for_selector("#signin:not([hidden])")
    assert "already used" in page.text_content("#signin-reason")
    assert page.is_hidden("#nav") and "lmsp-tray open" in page.text_content("#signin")
    screenshot(page, "signin")
    context.close()


# -- chat -----------------------------------------------------------------------------------------
def test_chat_streams_keeps_the_conversation_and_shows_figures(console: Console) -> None:
    page, live = console.page, console.live
    page.select_option("#chat-model", SLOW_ID)
    set_sampling(page, max_tokens=600)
    page.evaluate(
        """() => { window.lengths = [];
        new MutationObserver(() => {
          const b = [...document.querySelectorAll('.msg.assistant .bubble.markdown')].pop();
          if (b) window.lengths.push(b.textContent.length);
        }).observe(document.querySelector('.messages'), {subtree: true, childList: true, characterData: true}); }"""
    )
    page.fill("#chat-prompt", "Hello there")
    page.press("#chat-prompt", "Enter")
    figures = page.locator(".msg.assistant .figures").last
    wait_until(lambda: "out" in (figures.text_content() or ""), 120, "the answer to finish")
    lengths = page.evaluate("window.lengths")
    final = len(assistant_text(page))
    partial = sorted({n for n in lengths if 0 < n < final})
    assert final > 0 and len(partial) >= 3, f"the text did not stream in: {lengths[:20]}"
    text = figures.text_content() or ""
    for part in ("first token", "tok/s", "in", "600 out"):
        assert part in text, text

    set_sampling(page, max_tokens=50)  # the generated model's gibberish takes many tokens to read back
    page.fill("#chat-prompt", "And a second question")
    page.press("#chat-prompt", "Enter")
    wait_until(
        lambda: (
            page.locator(".msg.assistant .figures").count() == 2
            and "out" in (page.locator(".msg.assistant .figures").last.text_content() or "")
        ),
        120,
        "the second answer",
    )
    chats = json.loads(page.evaluate("localStorage.getItem('lmsp-tray.console.chats')"))
    assert len(chats) == 1 and len(chats[0]["turns"]) == 2 and chats[0]["title"] == "Hello there"
    first, second = chats[0]["turns"]
    stored = live.daemon.db.read(stored_responses.get, second)
    assert stored is not None and stored.previous_response_id == first  # continued on the service

    page.reload()  # the conversation comes back from the service's stored responses
    page.wait_for_selector(".msg.user >> nth=1")
    users = page.locator(".msg.user .bubble").all_text_contents()
    assert users == ["Hello there", "And a second question"]
    assert len(assistant_text(page)) > 0
    screenshot(page, "chat")


def test_stop_cancels_generation_on_the_service(console: Console) -> None:
    page, live = console.page, console.live
    with console.api() as c:
        c.post(f"/models/{SLOW_ID}/load").raise_for_status()
    sched = live.scheduler(SLOW_ID)
    page.select_option("#chat-model", SLOW_ID)
    set_sampling(page, max_tokens=4000)
    page.fill("#chat-prompt", "Write a long story")
    page.press("#chat-prompt", "Enter")
    wait_until(lambda: len(assistant_text(page)) > 20, 60, "the answer to start")
    assert page.is_visible("button:has-text('Stop')")
    page.click("button:has-text('Stop')")
    wait_until(lambda: sched.generating == 0, 5, "generation to stop on the service")
    steps = sched.steps
    time.sleep(0.5)
    assert sched.steps == steps, "decoding went on after Stop"
    assert steps < 4000
    status = page.locator(".msg.assistant .status").last
    wait_until(lambda: "Stopped" in (status.text_content() or ""), 10, "the page to say it stopped")
    assert page.is_visible("button:has-text('Send')")


# -- models ---------------------------------------------------------------------------------------
def test_models_view_loads_unloads_and_lists_broken_files_apart(console: Console) -> None:
    page = console.page
    console.view("models")
    card = page.locator("article.model", has=page.locator("h2", has_text=SLOW_ID))
    card.wait_for()
    assert "slow-test.gguf" in (card.locator(".path").text_content() or "")
    card.get_by_role("button", name="Load").click()
    with console.api() as c:
        wait_until(lambda: c.get(f"/models/{SLOW_ID}").json()["state"] == "loaded", 60, "the model to load")
    wait_until(lambda: "Loaded" in (card.locator(".badge").text_content() or ""), 10, "the card to say Loaded")
    assert "Runs on" in (card.locator(".runs").text_content() or "")
    screenshot(page, "models")
    card.get_by_role("button", name="Unload").click()
    with console.api() as c:
        wait_until(lambda: c.get(f"/models/{SLOW_ID}").json()["state"] == "available", 60, "the model to unload")
    broken = page.locator(".broken")
    assert BROKEN in (broken.text_content() or "") and "probably a download or copy" in (broken.text_content() or "")
    assert page.locator("article.model", has_text=BROKEN).count() == 0  # not among the models


# -- apps and tokens ------------------------------------------------------------------------------
def test_create_copy_and_revoke_a_token(console: Console) -> None:
    page = console.page
    console.view("apps")
    page.fill("#token-name", "from-console")
    page.click("button:has-text('Create token')")
    secret = page.locator("#new-secret")
    secret.wait_for()
    value = secret.input_value()
    assert value.startswith("lmsp_")
    with httpx.Client(base_url=console.live.url, headers={"Authorization": f"Bearer {value}"}, timeout=30) as app:
        assert app.get("/models").status_code == 200
        screenshot(page, "apps")
        page.click(".secret button:has-text('Done')")
        assert page.locator("#new-secret").count() == 0  # the secret does not stay in the page
        page.once("dialog", lambda d: d.accept())
        page.click("button[aria-label='Revoke from-console']")
        row = page.locator("tr", has_text="from-console")
        wait_until(lambda: "revoked" in (row.text_content() or ""), 10, "the row to say revoked")
        assert app.get("/models").status_code == 401


def test_approve_a_pairing_started_over_http(console: Console) -> None:
    page, live = console.page, console.live
    started = httpx.post(
        live.url + "/auth/pairings", json={"app_name": "Notes App", "scopes": ["models:read"]}, timeout=30
    )
    assert started.status_code == 202
    pairing = started.json()
    console.view("apps")
    card = page.locator(".pairing", has_text="Notes App")
    card.wait_for(timeout=10_000)
    assert pairing["user_code"] in (card.locator(".user-code").text_content() or "")
    screenshot(page, "apps-pairing")
    card.get_by_role("button", name="Approve Notes App").click()
    poll = {"Authorization": f"Bearer {pairing['poll_token']}"}
    doc = wait_until(
        lambda: (
            (
                d := httpx.get(live.url + pairing["poll_url"].removeprefix("/lmsp/v1"), headers=poll, timeout=30).json()
            ).get("token")
            and d
        ),
        10,
        "the app to get its token",
    )
    assert (
        httpx.get(live.url + "/models", headers={"Authorization": f"Bearer {doc['token']}"}, timeout=30).status_code
        == 200
    )
    wait_until(lambda: page.locator(".pairing").count() == 0, 10, "the request to leave the list")


# -- settings -------------------------------------------------------------------------------------
def test_settings_are_checked_written_and_applied(daemon_factory, lmsp_home: Path, browser) -> None:
    config = lmsp_home / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('# my settings\nmax_queue = 8  # a key the form does not show\nkeep_alive = "5m"  # idle\n')
    live = daemon_factory()
    console = open_console(live, browser)
    page = console.page
    console.view("settings")
    page.fill("#setting-keep_alive", "soon")
    page.click("button:has-text('Save')")
    error = page.locator("#setting-keep_alive-error")
    error.wait_for()
    assert (
        "duration" in (error.text_content() or "")
        and page.get_attribute("#setting-keep_alive", "aria-invalid") == "true"
    )
    assert 'keep_alive = "5m"' in config.read_text()  # refused: nothing written

    page.fill("#setting-keep_alive", "10m")
    page.fill("#setting-context_cap", "1024")
    page.fill("#setting-port", "8123")
    page.click("button:has-text('Save')")
    page.locator(".banner").wait_for()
    text = config.read_text()
    values = tomllib.loads(text)
    assert values == {"max_queue": 8, "keep_alive": "10m", "context_cap": 1024, "port": 8123}
    assert "# my settings" in text and "# a key the form does not show" in text and "# idle" in text
    assert live.daemon.config.keep_alive == 600 and live.daemon.config.context_cap == 1024  # applied now
    assert "Port" in (page.text_content(".banner") or "")  # the port waits for a restart
    screenshot(page, "settings")
    console.context.close()
    assert console.errors == []


# -- security against other origins ---------------------------------------------------------------
ATTACK_PAGE = """<!doctype html><html><body><iframe id="frame"></iframe><script>
const target = new URL(location.href).searchParams.get("target");
const code = new URL(location.href).searchParams.get("code");
async function attempt(name, fn) {
  try { const r = await fn(); return [name, "answered " + r.status + " " + (await r.text()).slice(0, 80)]; }
  catch (e) { return [name, "refused " + e.name]; }
}
(async () => {
  const results = [];
  results.push(await attempt("exchange", () => fetch(target + "/lmsp/v1/console/sessions",
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({code})})));
  results.push(await attempt("exchange-no-cors", () => fetch(target + "/lmsp/v1/console/sessions",
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: JSON.stringify({code})})));
  results.push(await attempt("read-page", () => fetch(target + "/console/")));
  results.push(await attempt("read-models", () => fetch(target + "/lmsp/v1/models", {credentials: "include"})));
  results.push(await attempt("create-token", () => fetch(target + "/lmsp/v1/auth/tokens", {method: "POST",
    credentials: "include", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({name: "evil", scopes: ["tokens:manage"]})})));
  document.getElementById("frame").src = target + "/console/";
  await new Promise((r) => setTimeout(r, 1500));
  let framed;
  try { framed = "read " + document.getElementById("frame").contentDocument.body.innerHTML.length; }
  catch (e) { framed = "blocked " + e.name; }
  results.push(["frame", framed]);
  document.title = "done";
  window.results = results;
})();
</script></body></html>"""


@pytest.fixture
def other_origin(tmp_path: Path) -> Iterator[str]:
    """A second local web server: another origin (another port of 127.0.0.1)."""
    root = tmp_path / "attacker"
    root.mkdir()
    (root / "index.html").write_text(ATTACK_PAGE)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_another_origin_cannot_read_or_act_through_the_console(console: Console, other_origin: str) -> None:
    live = console.live
    code = live.daemon.console_link().split("#code=", 1)[1]  # suppose the attacker even got a fresh code
    page = console.context.new_page()  # same browser, next to a signed-in console tab
    responses: list[Any] = []
    page.on("response", lambda r: responses.append(r) if r.url.startswith(live.base) else None)
    page.goto(f"{other_origin}/index.html?target={live.base}&code={code}")
    wait_until(lambda: page.title() == "done", 20, "the other origin's attempts")
    results = dict(page.evaluate("window.results"))
    assert results["exchange"] == "refused TypeError"
    assert results["exchange-no-cors"].startswith("answered 0")  # opaque: nothing to read
    assert results["read-page"] == "refused TypeError"
    assert results["read-models"] == "refused TypeError"
    assert results["create-token"] == "refused TypeError"
    assert results["frame"].startswith("blocked")
    for r in responses:  # what the service answered each of them
        assert "access-control-allow-origin" not in r.headers, r.url
        if "/lmsp/v1/" in r.url:
            assert r.status == 403, (r.url, r.status)
    # The code was never spent: the service refused before looking at it, so the real page can use it.
    assert httpx.post(live.url + "/console/sessions", json={"code": code}, timeout=30).status_code == 201
    with console.api() as c:
        assert "evil" not in [t["name"] for t in c.get("/auth/tokens").json()["data"]]
    page.close()


def test_console_responses_carry_the_csp_and_frame_headers(daemon: LiveDaemon) -> None:
    for path in ("/console/", "/console/app.js", "/console/console.css", "/console/no-such-file"):
        r = httpx.get(daemon.base + path, timeout=30)
        assert r.status_code == (404 if "no-such" in path else 200), path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "http" not in csp  # no inline script, no remote source
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        assert "access-control-allow-origin" not in r.headers
    assert httpx.get(daemon.base + "/console", timeout=30, follow_redirects=False).headers["location"] == "/console/"
    page = httpx.get(daemon.base + "/console/", timeout=30).text
    assert "<script>" not in page and "http" not in page.split("<body>")[0].replace("http-equiv", "")
    # The console's own origin is allowed without CORS; any other is refused.
    own = httpx.get(daemon.url + "/models", headers={**daemon.auth_headers, "Origin": daemon.base}, timeout=30)
    assert own.status_code == 200 and "access-control-allow-origin" not in own.headers
    other = httpx.get(
        daemon.url + "/models", headers={**daemon.auth_headers, "Origin": "http://127.0.0.1:1"}, timeout=30
    )
    assert other.status_code == 403 and other.json()["code"] == "forbidden_origin"


def test_no_secret_in_the_activity_log_or_the_page_url(console: Console) -> None:
    page, live = console.page, console.live
    console.view("apps")
    page.fill("#token-name", "logged-app")
    page.click("button:has-text('Create token')")
    secret = page.locator("#new-secret").input_value()
    httpx.get(live.url + "/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    httpx.get(
        live.url + "/models", headers={"Authorization": "Bearer lmsp_not-a-real-token-but-shaped-like-one"}, timeout=30
    )
    console.view("activity")
    page.locator(".requests tbody tr", has_text="logged-app").first.wait_for(timeout=10_000)
    dump = json.dumps(live.daemon.activity.snapshot())
    token = json.loads(page.evaluate("sessionStorage.getItem('lmsp-tray.console.session')"))["token"]
    for value in (secret, token, "lmsp_not-a-real-token"):
        assert value not in dump and value not in (page.text_content(".log") or "")
    assert not re.search(r"lmsp[pc]?_[A-Za-z0-9_-]{20,}", dump)  # nothing shaped like a secret or a code
    assert page.url == live.base + "/console/#activity" and "lmsp" not in page.evaluate("history.state || ''")
    screenshot(page, "activity")


# -- keyboard, labels, screenshots ----------------------------------------------------------------
def test_keyboard_navigation_and_labels(console: Console) -> None:
    page = console.page
    page.click(".brand")  # the chat focuses its message box; start from the top bar instead
    page.keyboard.press("Shift+Tab")  # before the brand: the skip link, first in the page
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    for _ in range(2):
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.view") == "models"  # Chat, then Models
    page.keyboard.press("Enter")
    page.wait_for_selector("#view-models:not([hidden])")
    for view in ("chat", "models", "apps", "activity", "settings"):
        console.view(view)
        page.wait_for_timeout(300)
        assert page.evaluate(UNLABELLED_CONTROLS) == [], f"controls without a label in {view}"
    console.view("chat")
    page.select_option("#chat-model", TINY_ID)
    page.focus("#chat-prompt")
    page.keyboard.type("Hi")
    page.keyboard.press("Enter")  # Enter sends
    wait_until(lambda: "out" in (page.locator(".msg.assistant .figures").last.text_content() or ""), 60, "an answer")


def test_screenshots_of_every_view(console: Console, browser) -> None:
    """Each view at 1280x800 and at a narrow width, with something in it, for people to look at."""
    live = console.live
    with console.api() as c:
        c.post(f"/models/{TINY_ID}/load").raise_for_status()
        c.post("/responses", json={"model": TINY_ID, "input": "warm up", "max_output_tokens": 8}).raise_for_status()
    httpx.post(
        live.url + "/auth/pairings",
        json={"app_name": "Editor Plugin", "scopes": ["models:read", "responses:create"]},
        timeout=30,
    )
    page = console.page
    page.select_option("#chat-model", TINY_ID)
    set_sampling(page, max_tokens=40)
    page.fill("#chat-prompt", "Show me some **markdown** and `code`")
    page.press("#chat-prompt", "Enter")
    wait_until(lambda: "out" in (page.locator(".msg.assistant .figures").last.text_content() or ""), 60, "an answer")
    page.wait_for_timeout(2500)  # a couple of activity samples
    for viewport in (WIDE, NARROW):
        page.set_viewport_size(viewport)
        for view in ("chat", "models", "apps", "activity", "settings"):
            console.view(view)
            page.wait_for_timeout(400)
            path = screenshot(page, view)
            assert path.stat().st_size > 5000
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"{view} scrolls sideways at {viewport['width']} px"
    dark = browser.new_context(viewport=WIDE, color_scheme="dark")  # the page follows the desktop's scheme
    night = dark.new_page()
    night.goto(live.daemon.console_link())
    night.wait_for_selector("#nav:not([hidden])")
    for view in ("chat", "models"):
        night.click(f"#nav a[data-view={view}]")
        night.wait_for_timeout(400)
        screenshot(night, f"dark-{view}")
    assert night.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(20, 23, 28)"
    dark.close()


def test_thinking_is_shown_collapsed(daemon_factory, models_dir: Path, browser) -> None:
    from chat_templates import DEEPSEEK_R1
    from gguf_factory import write_tiny_gguf

    # A generated reasoning model (DeepSeek R1's template) that closes its thinking soon.
    write_tiny_gguf(
        models_dir / "r1-tiny.gguf",
        chat_template=DEEPSEEK_R1,
        basename="r1-tiny",
        seed=5,
        context_length=4096,
        output_scale=0.5,
        logit_bias={'"': 75.0, "</think>": 65.0},
    )
    console = open_console(daemon_factory(), browser)
    page = console.page
    page.select_option("#chat-model", "r1-tiny:1m-f32")
    set_sampling(page, max_tokens=60)
    page.fill("#chat-prompt", "Think first")
    page.press("#chat-prompt", "Enter")
    wait_until(lambda: "out" in (page.locator(".msg.assistant .figures").last.text_content() or ""), 60, "an answer")
    thinking = page.locator(".msg.assistant details.thinking").last
    assert thinking.is_visible() and thinking.get_attribute("open") is None  # there, and collapsed
    assert (thinking.locator(".thinking-body").text_content() or "").strip()
    thinking.locator("summary").click()
    assert thinking.get_attribute("open") is not None
    console.context.close()
    assert console.errors == []


def test_models_view_shows_fill_in_the_middle(daemon_factory, models_dir: Path, browser) -> None:
    from gguf_factory import write_tiny_gguf

    write_tiny_gguf(models_dir / "fim-coder.gguf", basename="fim-coder", fim="names", seed=8)
    console = open_console(daemon_factory(), browser)
    console.view("models")
    page = console.page
    chips = {}
    for model_id in ("fim-coder:1m-f32", TINY_ID):
        card = page.locator("article.model", has=page.locator("h2", has_text=model_id))
        card.wait_for()
        chips[model_id] = card.locator(".chips li").all_text_contents()
    assert "fill-in-the-middle" in chips["fim-coder:1m-f32"] and "text" in chips["fim-coder:1m-f32"]
    assert "fill-in-the-middle" not in chips[TINY_ID] and "text" in chips[TINY_ID]
    console.context.close()
    assert console.errors == []


def test_attach_an_image_on_a_vision_model(daemon_factory, models_dir: Path, browser, tmp_path: Path) -> None:
    import io

    from gguf_factory import write_tiny_vision_pair
    from PIL import Image

    write_tiny_vision_pair(models_dir)
    picture = tmp_path / "picture.png"
    Image.new("RGB", (64, 48), (200, 40, 40)).save(picture, "PNG")
    console = open_console(daemon_factory(), browser)
    page = console.page
    page.select_option("#chat-model", TINY_ID)
    assert page.locator("#chat-attach").is_hidden()  # a text-only model takes no images
    page.select_option("#chat-model", "tiny-vision:1m-f32")
    assert page.locator("#chat-attach").is_visible()
    set_sampling(page, max_tokens=4)
    page.set_input_files("input[type=file]", str(picture))
    page.locator(".attached img").wait_for()
    # pasting an image adds another one
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 0, 255)).save(buffer, "PNG")
    page.evaluate(
        """(bytes) => { const file = new File([new Uint8Array(bytes)], 'pasted.png', {type: 'image/png'});
        const data = new DataTransfer(); data.items.add(file);
        document.querySelector('#chat-prompt').dispatchEvent(new ClipboardEvent('paste', {clipboardData: data})); }""",
        list(buffer.getvalue()),
    )
    wait_until(lambda: page.locator(".attached img").count() == 2, 10, "the pasted image")
    page.fill("#chat-prompt", "What is in the picture?")
    page.press("#chat-prompt", "Enter")
    figures = page.locator(".msg.assistant .figures").last
    wait_until(lambda: "out" in (figures.text_content() or ""), 120, "the answer to finish")
    assert page.locator(".msg.user .sent-image").count() == 2
    assert page.locator(".attached img").count() == 0
    text = figures.text_content() or ""
    assert int(re.search(r"(\d+) in", text).group(1)) > 2 * 784, text  # both images reached the model
    console.context.close()
    assert console.errors == []


def test_attach_audio_on_an_audio_model(daemon_factory, models_dir: Path, browser, tmp_path: Path) -> None:
    from gguf_factory import tone_wav, write_tiny_audio_pair

    write_tiny_audio_pair(models_dir)
    clip = tmp_path / "clip.wav"
    clip.write_bytes(tone_wav(0.5))
    console = open_console(daemon_factory(), browser)
    page = console.page
    page.select_option("#chat-model", TINY_ID)
    assert page.locator("#chat-attach").is_hidden()  # a text-only model takes no audio
    page.select_option("#chat-model", "tiny-audio:1m-f32")
    assert page.locator("#chat-attach").is_visible()
    assert page.locator("input[type=file]").get_attribute("accept") == "audio/*"
    set_sampling(page, max_tokens=3)
    page.set_input_files("input[type=file]", str(clip))
    page.locator(".attached audio").wait_for()
    page.fill("#chat-prompt", "What is said?")
    page.press("#chat-prompt", "Enter")
    figures = page.locator(".msg.assistant .figures").last
    wait_until(lambda: "out" in (figures.text_content() or ""), 120, "the answer to finish")
    assert page.locator(".msg.user .sent-audio").count() == 1
    assert page.locator(".attached audio").count() == 0
    text = figures.text_content() or ""
    assert int(re.search(r"(\d+) in", text).group(1)) > 150, text  # the audio's 150 tokens reached the model
    # reopened from the service, the turn shows its audio again
    page.reload()
    page.locator(".msg.user .sent-audio").wait_for()
    console.context.close()
    assert console.errors == []
