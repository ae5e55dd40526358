"""`GET /metrics` over real HTTP: Prometheus's text format, read with the official `prometheus_client` parser.

Real requests to the tiny generated model move the counters, and every figure
equals what ``GET /lmsp/v1/activity`` shows (its `totals` and its rows): one
bookkeeping, two views. The scope is `activity:read`; `metrics_keyless` opens
the path alone to scrapes without a token.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import TINY_ID, LiveDaemon

pytestmark = pytest.mark.timeout(300)


def _scrape(live: LiveDaemon, headers: dict[str, str] | None = None) -> dict[str, list]:
    r = httpx.get(live.base + "/metrics", headers=live.auth_headers if headers is None else headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f.samples for f in text_string_to_metric_families(r.text)}
    return families


def _value(families: dict[str, list], sample: str, **labels: str) -> float:
    family = sample.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
    for s in families.get(family, []):
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


def _chat(v1: httpx.Client, text: str) -> dict:
    r = v1.post(
        "/chat/completions",
        json={"model": TINY_ID, "messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_counters_move_with_requests_and_match_activity(live: LiveDaemon, v1: httpx.Client) -> None:
    _chat(v1, "warm up")  # loaded, and a first figure in every family
    before = _scrape(live)
    route = {"model": TINY_ID, "method": "POST", "route": "/v1/chat/completions", "status": "200"}
    answers = [_chat(v1, f"count to {n}") for n in range(3)]
    after = _scrape(live)

    assert _value(after, "lmsp_requests_total", **route) == _value(before, "lmsp_requests_total", **route) + 3
    generated = sum(a["usage"]["completion_tokens"] for a in answers)
    prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
    moved = {
        name: _value(after, name, model=TINY_ID) - _value(before, name, model=TINY_ID)
        for name in ("lmsp_generated_tokens_total", "lmsp_prompt_tokens_total", "lmsp_prompt_cached_tokens_total")
    }
    assert moved["lmsp_generated_tokens_total"] == generated
    assert moved["lmsp_prompt_tokens_total"] + moved["lmsp_prompt_cached_tokens_total"] == prompt
    ttft = "lmsp_time_to_first_token_seconds_count"
    assert _value(after, ttft, model=TINY_ID) == _value(before, ttft, model=TINY_ID) + 3
    buckets = [s for s in after["lmsp_time_to_first_token_seconds"] if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == _value(after, ttft, model=TINY_ID)
    gaps = _value(after, "lmsp_inter_token_seconds_count", model=TINY_ID)
    assert gaps - _value(before, "lmsp_inter_token_seconds_count", model=TINY_ID) == generated - 3
    assert _value(after, "lmsp_models_loaded") >= 1 and _value(after, "lmsp_models_available") >= 1
    assert _value(after, "lmsp_model_load_seconds", model=TINY_ID) > 0
    assert _value(after, "lmsp_model_queued_requests", model=TINY_ID) == 0
    memory = [s for s in after["lmsp_model_memory_bytes"] if s.labels["model"] == TINY_ID]
    assert memory and all(s.value > 0 for s in memory if s.labels["device"].startswith("cpu"))
    assert _value(after, "lmsp_store_bytes") > 0
    stats = live.daemon.models.get(TINY_ID).stats()
    assert _value(after, "lmsp_draft_tokens_total", model=TINY_ID) == stats.drafted
    assert _value(after, "lmsp_draft_tokens_accepted_total", model=TINY_ID) == stats.accepted
    assert _value(after, "lmsp_tokens_issued_total") >= _value(after, "lmsp_generated_tokens_total", model=TINY_ID)

    # The same counters as /activity's: its totals, and the rows of the requests themselves.
    activity = httpx.get(live.url + "/activity", headers=live.auth_headers, timeout=60).json()
    totals = activity["totals"]
    mine = totals["models"][TINY_ID]
    now = _scrape(live)
    assert mine["generated_tokens"] == _value(now, "lmsp_generated_tokens_total", model=TINY_ID)
    assert mine["prompt_tokens"] == _value(now, "lmsp_prompt_tokens_total", model=TINY_ID)
    assert mine["ttft_seconds"]["count"] == _value(now, ttft, model=TINY_ID)
    counted = next(r["count"] for r in totals["requests"] if (r["model"], r["route"], r["status"]) == (
        TINY_ID, "/v1/chat/completions", "200"))  # fmt: skip
    assert counted == _value(now, "lmsp_requests_total", **route)
    rows = [r for r in activity["requests"] if r["endpoint"] == "/v1/chat/completions"]
    assert [r["tokens_out"] for r in rows[-3:]] == [a["usage"]["completion_tokens"] for a in answers]


def test_scope_and_keyless_scrapes(live: LiveDaemon, daemon_factory: Callable[..., LiveDaemon]) -> None:
    assert httpx.get(live.base + "/metrics", timeout=30).status_code == 401
    open_one = daemon_factory(metrics_keyless=True)
    families = _scrape(open_one, headers={})
    assert "lmsp_requests" in families and "lmsp_models_loaded" in families
    # only /metrics is opened: the activity log itself still needs its scope
    assert httpx.get(open_one.url + "/activity", timeout=30).status_code == 401


def test_the_settings_form_opens_and_closes_keyless_scrapes_at_once(daemon_factory: Callable[..., LiveDaemon]) -> None:
    """`metrics_keyless` is a field of the console's Settings (PATCH /settings): it applies without a restart."""
    live = daemon_factory()
    scrape = live.base + "/metrics"
    with httpx.Client(base_url=live.url, timeout=30, headers=live.auth_headers) as c:
        form = c.get("/settings").json()
        assert any(f["key"] == "metrics_keyless" and f["applies"] == "now" for f in form["fields"])
        assert httpx.get(scrape, timeout=30).status_code == 401
        c.patch("/settings", json={"metrics_keyless": True}).raise_for_status()
        assert httpx.get(scrape, timeout=30).status_code == 200
        c.patch("/settings", json={"metrics_keyless": False}).raise_for_status()
        assert httpx.get(scrape, timeout=30).status_code == 401
