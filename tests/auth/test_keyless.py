"""`keyless_scopes`: off by default; when set, requests without a valid token get exactly those scopes.

Over real HTTP against a live daemon: without the setting, no token and a
placeholder token are 401 everywhere; with `keyless_scopes = ["models:read",
"responses:create"]` such requests may list models and generate, on `/v1` and
`/lmsp/v1`, but never manage tokens, models or settings; Host and Origin
checks still apply; what a keyless app stores no token can read. The
setting is refused in config.toml for scopes that manage anything, and the
tray says while it is on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from browser import UNLABELLED_CONTROLS, browser, open_console  # noqa: F401 - fixture
from support import TINY_ID, LiveDaemon

from lmsp_tray.config import ConfigError, config_from_mapping
from lmsp_tray.desktop.autostart import Autostart
from lmsp_tray.desktop.backend import DaemonTrayBackend

OPEN = ["models:read", "responses:create"]
NO_KEY: list[dict[str, str]] = [
    {},
    {"Authorization": "Bearer noop"},
    {"Authorization": "Bearer lmsp_revoked_or_made_up"},
]


def generate(base: str, headers: dict[str, str], **extra: object) -> httpx.Response:
    body = {"model": TINY_ID, "input": "hello", "max_output_tokens": 2, **extra}
    return httpx.post(base + "/lmsp/v1/responses", json=body, headers=headers, timeout=120)


def test_off_by_default(daemon: LiveDaemon) -> None:
    for headers in NO_KEY:
        assert httpx.get(daemon.base + "/v1/models", headers=headers, timeout=30).status_code == 401
        assert httpx.get(daemon.base + "/lmsp/v1/models", headers=headers, timeout=30).status_code == 401
        assert generate(daemon.base, headers).status_code == 401


def test_keyless_scopes_grant_exactly_what_is_listed(daemon_factory: Callable[..., LiveDaemon]) -> None:
    live = daemon_factory(keyless_scopes=OPEN)
    base = live.base
    for headers in NO_KEY:
        listing = httpx.get(base + "/v1/models", headers=headers, timeout=30)
        assert listing.status_code == 200 and any(m["id"] == TINY_ID for m in listing.json()["data"])
        assert httpx.get(base + "/lmsp/v1/models", headers=headers, timeout=30).status_code == 200
        made = generate(base, headers)
        assert made.status_code == 200 and made.json()["object"] == "response", made.text
        # ... and nothing else: managing tokens, models and settings, reading stored responses
        assert httpx.get(base + "/lmsp/v1/auth/tokens", headers=headers, timeout=30).status_code == 401
        load = httpx.post(f"{base}/lmsp/v1/models/{TINY_ID}/load", headers=headers, timeout=30)
        assert load.status_code == 401 and load.json()["code"] == "unauthorized"
        assert httpx.get(f"{base}/lmsp/v1/responses/{made.json()['id']}", headers=headers, timeout=30).status_code in (
            401,
            404,
        )
    # still behind the Host and Origin checks
    evil = httpx.get(base + "/v1/models", headers={"Host": "attacker.example"}, timeout=30)
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "forbidden_host"
    page = httpx.get(base + "/v1/models", headers={"Origin": "https://attacker.example"}, timeout=30)
    assert page.status_code == 403 and page.json()["error"]["code"] == "forbidden_origin"
    # a real token keeps its own rights (and is not made smaller by the keyless grant)
    owner = live.auth_headers
    assert httpx.get(base + "/lmsp/v1/auth/tokens", headers=owner, timeout=30).status_code == 200
    # the console's activity log says who asked
    rows = httpx.get(base + "/lmsp/v1/activity", headers=owner, timeout=30).json()["requests"]
    made_rows = [r for r in rows if r["endpoint"] == "/lmsp/v1/responses" and r["status"] == 200]
    assert made_rows and all(r["app"] == "(no token)" for r in made_rows)
    assert any(r["app"] == "lmsp-tray owner" for r in rows)


def test_what_a_keyless_app_stores_no_token_reads(daemon_factory: Callable[..., LiveDaemon]) -> None:
    live = daemon_factory(keyless_scopes=["models:read", "responses:create", "responses:read"])
    made = generate(live.base, {}, store=True)
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    assert httpx.get(f"{live.base}/lmsp/v1/responses/{rid}", timeout=30).status_code == 200  # keyless: its own
    owner = httpx.get(f"{live.base}/lmsp/v1/responses/{rid}", headers=live.auth_headers, timeout=30)
    assert owner.status_code == 404  # owned by "keyless", not by any token
    mine = generate(live.base, live.auth_headers, store=True).json()["id"]
    assert httpx.get(f"{live.base}/lmsp/v1/responses/{mine}", timeout=30).status_code == 404


def test_settings_changed_live_apply_at_once(daemon: LiveDaemon) -> None:
    assert httpx.get(daemon.base + "/v1/models", timeout=30).status_code == 401
    daemon.daemon.apply_settings({"keyless_scopes": ["models:read"]})
    assert httpx.get(daemon.base + "/v1/models", timeout=30).status_code == 200
    assert generate(daemon.base, {}).status_code == 401  # responses:create was not granted
    daemon.daemon.apply_settings({"keyless_scopes": []})
    assert httpx.get(daemon.base + "/v1/models", timeout=30).status_code == 401


def test_tray_shows_it_while_on(daemon: LiveDaemon, tmp_path: Path) -> None:
    home = tmp_path / "desktop-home"
    home.mkdir()
    autostart = Autostart.for_platform("linux", environ={}, home=home, command=["/opt/lmsp-tray/lmsp-tray"])
    backend = DaemonTrayBackend(daemon.daemon, autostart)
    assert not (backend.snapshot().notice or "").count("without a token")
    daemon.daemon.apply_settings({"keyless_scopes": OPEN})
    notice = backend.snapshot().notice or ""
    assert "Apps without a token may use: models:read, responses:create" in notice


@pytest.mark.parametrize("scope", ["tokens:manage", "models:manage", "settings:manage", "activity:read", "nope"])
def test_config_refuses_managing_scopes(scope: str) -> None:
    with pytest.raises(ConfigError, match="cannot be granted without a token"):
        config_from_mapping({"keyless_scopes": ["models:read", scope]})
    assert config_from_mapping({"keyless_scopes": ["responses:create", "models:read"]}).keyless_scopes == OPEN
    assert config_from_mapping({}).keyless_scopes == []


def test_console_settings_turn_it_on_and_off(daemon: LiveDaemon) -> None:
    with httpx.Client(base_url=daemon.url, headers=daemon.auth_headers, timeout=60) as c:
        doc = c.get("/settings").json()
        field = next(f for f in doc["fields"] if f["key"] == "keyless_scopes")
        assert (
            field["kind"] == "scopes"
            and "tokens:manage" not in field["choices"]
            and doc["values"]["keyless_scopes"] == []
        )
        refused = c.patch("/settings", json={"keyless_scopes": ["models:read", "tokens:manage"]})
        assert refused.status_code == 400 and refused.json()["param"] == "keyless_scopes"
        on = c.patch("/settings", json={"keyless_scopes": ["models:read"]})
        assert on.status_code == 200 and on.json()["applied"] == ["keyless_scopes"], on.text
        assert 'keyless_scopes = ["models:read"]' in daemon.daemon.paths.config_file.read_text()
        assert httpx.get(daemon.base + "/v1/models", timeout=30).status_code == 200  # at once, no restart
        off = c.patch("/settings", json={"keyless_scopes": []})
        assert off.status_code == 200
    assert httpx.get(daemon.base + "/v1/models", timeout=30).status_code == 401


def test_console_page_ticks_scopes(daemon: LiveDaemon, browser) -> None:
    console = open_console(daemon, browser)
    page = console.page
    console.view("settings")
    page.wait_for_selector("#setting-keyless_scopes input[type=checkbox]")  # the form loads its settings first
    boxes = page.locator("#setting-keyless_scopes input[type=checkbox]")
    assert boxes.count() == 5 and not any(boxes.nth(i).is_checked() for i in range(5))
    assert page.evaluate(UNLABELLED_CONTROLS) == []
    page.check("#setting-keyless_scopes input[value='models:read']")
    page.check("#setting-keyless_scopes input[value='responses:create']")
    page.click("button:has-text('Save')")
    page.wait_for_function("() => document.body.textContent.includes('Saved to config.toml')")
    assert daemon.daemon.config.keyless_scopes == OPEN
    assert httpx.get(daemon.base + "/v1/models", timeout=30).status_code == 200
    console.context.close()
    assert console.errors == []
