"""The activity log (serving/activity.py): redaction, cursors, the tokens/s series, and over real HTTP the
rows a streamed response, a refused token and a model load leave."""

from __future__ import annotations

import logging
import time

import httpx
from support import SSE, TINY_ID, body, iter_sse

from lmsp_tray.serving.activity import ActivityLog, LogBuffer, RunFigures, redact


def test_secret_shaped_strings_are_redacted() -> None:
    token = "lmsp_" + "A1b2C3d4" * 5
    for text in (
        f"using {token} now",
        "poll lmspp_abcdefghijklmnop",
        "code lmspc_0123456789abcdefXYZ",
        "Authorization: Bearer sk-abcdefghijkl",
    ):
        assert "[redacted]" in redact(text)
        assert token not in redact(text) and "abcdefghijkl" not in redact(text)
    assert redact("logger lmsp_tray.daemon is fine") == "logger lmsp_tray.daemon is fine"


def test_log_lines_are_kept_redacted() -> None:
    activity = ActivityLog()
    logger = logging.getLogger("console_tests.activity")  # outside lmsp_tray: the suite audits its log
    logger.setLevel(logging.INFO)
    handler = LogBuffer(activity)
    logger.addHandler(handler)
    try:
        logger.info("token %s created", "lmsp_" + "x" * 43)
        logger.debug("below the level")
        try:
            raise ValueError("boom lmspc_" + "y" * 30)
        except ValueError:
            logger.exception("it failed")
    finally:
        logger.removeHandler(handler)
    lines = activity.snapshot()["log"]
    assert [ln["message"] for ln in lines] == ["token [redacted] created", "it failed (ValueError: boom [redacted])"]


def test_cursor_returns_only_what_changed() -> None:
    activity = ActivityLog()
    entry, context = activity.begin("POST", "/lmsp/v1/responses", None)
    activity.reset(context)
    first = activity.snapshot()
    assert [r["id"] for r in first["requests"]] == [entry.id]
    assert activity.snapshot(first["cursor"])["requests"] == []
    activity.status(entry, 200, "app")
    changed = activity.snapshot(first["cursor"])["requests"]
    assert [(r["id"], r["status"], r["app"], r["done"]) for r in changed] == [(entry.id, 200, "app", False)]


def test_a_run_lands_on_the_current_request_or_its_own_row() -> None:
    activity = ActivityLog()
    entry, context = activity.begin("POST", "/lmsp/v1/responses", None)
    now = time.monotonic()
    figures = RunFigures("m", "completed", 10, 21, 4, now, now + 0.1, now + 1.1)
    activity.run_finished(figures)
    activity.reset(context)
    activity.run_finished(figures)  # no request around it (a task after a restart)
    rows = {r["id"]: r for r in activity.snapshot()["requests"]}
    mine = rows[entry.id]
    assert (mine["model"], mine["tokens_in"], mine["tokens_out"], mine["cached_tokens"]) == ("m", 10, 21, 4)
    assert mine["tokens_per_s"] == 20.0
    assert len(rows) == 2 and [r["endpoint"] for r in rows.values()].count("(task)") == 1


def test_the_series_measures_tokens_per_second() -> None:
    produced = [0]
    activity = ActivityLog(output_tokens=lambda: produced[0], models_bytes=lambda: 123, rss_bytes=lambda: 456)
    activity.sample()
    produced[0] = 100
    time.sleep(0.2)
    point = activity.sample()
    assert 100 / 0.5 < point.tokens_per_s <= 100 / 0.2 and point.models_bytes == 123 and point.rss_bytes == 456
    assert len(activity.snapshot()["series"]) == 2


def test_requests_show_up_with_app_model_and_figures(daemon) -> None:
    bad = httpx.get(daemon.url + "/models", headers={"Authorization": "Bearer lmsp_" + "Z" * 43}, timeout=30)
    assert bad.status_code == 401
    with httpx.Client(base_url=daemon.url, headers=daemon.auth_headers, timeout=60) as c:
        c.post(f"/models/{TINY_ID}/load").raise_for_status()
        with c.stream("POST", "/responses", json=body(max_output_tokens=12, stream=True)) as r:
            events = [e for e in iter_sse(r) if isinstance(e, SSE)]
        assert events[-1].event in ("response.completed", "response.incomplete")
        doc = c.get("/activity").json()
        again = c.get("/activity", params={"after": doc["cursor"]}).json()
    rows = doc["requests"]
    refused = next(r for r in rows if r["status"] == 401)
    assert refused["endpoint"] == "/lmsp/v1/models" and refused["app"] is None
    load = next(r for r in rows if r["endpoint"].endswith("/load"))
    assert load["model"] == TINY_ID and load["app"] == "lmsp-tray owner" and load["status"] == 200
    stream = next(r for r in rows if r["endpoint"] == "/lmsp/v1/responses")
    assert stream["model"] == TINY_ID and stream["tokens_out"] == 12 and stream["tokens_in"] > 0
    assert stream["ttft_ms"] is not None and stream["done"] and stream["outcome"] == "incomplete"
    assert not [r for r in rows if r["endpoint"] == "/lmsp/v1/activity"]  # its own polling is left out
    assert again["requests"] == []
    assert any("loaded" in ln["message"] for ln in doc["log"])
    assert "Z" * 43 not in str(doc)
