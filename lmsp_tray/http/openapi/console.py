"""The OpenAPI description of the console's endpoints (`console_routes`): operations and shapes.

A surface of its own beside `lmsp` (LMSP's) and `openai` (/v1's): these endpoints are
lmsp-tray's own (the console's code exchange, the activity log, the settings
form, "open folder") plus OpenAI's ``GET /responses/{id}/input_items``.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.auth.console import CODE_PREFIX
from lmsp_tray.http.openapi.parts import (
    BOOL,
    INT,
    NULL,
    NUM,
    STR,
    json_answer,
    json_body,
    nullable,
    obj,
    operation,
    path_param,
    ref,
)
from lmsp_tray.http.openapi.schemas import SCOPE

MAX_CURSOR = 10**15 - 1


def _nullable_any(*options: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*options, NULL]}


def schemas() -> dict[str, Any]:
    """The console's request and answer shapes."""
    request_row = obj(
        {
            "id": INT,
            "seq": INT,
            "time": NUM,
            "method": STR,
            "endpoint": STR,
            "app": nullable(STR),
            "status": nullable(INT),
            "duration_ms": nullable(NUM),
            "model": nullable(STR),
            "outcome": nullable(STR),
            "tokens_in": nullable(INT),
            "tokens_out": nullable(INT),
            "cached_tokens": nullable(INT),
            "ttft_ms": nullable(NUM),
            "tokens_per_s": nullable(NUM),
            "done": BOOL,
        }
    )
    log_line = obj({"seq": INT, "time": NUM, "level": STR, "logger": STR, "message": STR})
    point = obj({"time": NUM, "tokens_per_s": NUM, "rss_bytes": nullable(INT), "models_bytes": INT})
    field = obj(
        {
            "key": STR,
            "label": STR,
            "kind": STR,
            "help": STR,
            "applies": {"enum": ["restart", "now", "next_load"]},
        },
        {"choices": {"type": "array", "items": STR}},
    )
    settings = obj(
        {
            "object": {"const": "settings"},
            "config_file": STR,
            "fields": {"type": "array", "items": field},
            "values": {"type": "object"},
            "running": {"type": "object"},
            "restart_required": {"type": "array", "items": STR},
        },
        {"applied": {"type": "array", "items": STR}},
    )
    update = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "description": "The settings to change; null removes a key from config.toml (its default applies). "
        "Checked by the same rules as config.toml at start.",
        "properties": {
            "port": nullable({"type": "integer", "minimum": 1, "maximum": 65535}),
            "models_dirs": nullable({"type": "array", "items": STR}),
            "default_dirs": nullable(BOOL),
            "keep_alive": _nullable_any(STR, NUM),
            "context_cap": nullable({"type": "integer", "minimum": 1}),
            "parallel": nullable({"type": "integer", "minimum": 1}),
            "max_loaded_models": nullable({"type": "integer", "minimum": 1}),
            "gpu": nullable({"enum": ["auto", "off"]}),
            "start_at_login": BOOL,
        },
    }
    return {
        "ConsoleSessionCreate": obj({"code": {"type": "string", "pattern": f"^{CODE_PREFIX}"}}),
        "ConsoleSession": obj(
            {
                "object": {"const": "console.session"},
                "token": {"type": "string", "pattern": "^lmsp_"},
                "token_id": STR,
                "name": STR,
                "scopes": {"type": "array", "items": SCOPE},
            }
        ),
        "ConsoleLink": obj({"object": {"const": "console.link"}, "url": STR, "expires_at": INT}),
        "ConsoleReveal": obj({"model": STR}),
        "ConsoleRevealed": obj({"object": {"const": "console.reveal"}, "model": STR, "folder": STR}),
        "Activity": obj(
            {
                "object": {"const": "activity"},
                "cursor": INT,
                "requests": {"type": "array", "items": request_row},
                "log": {"type": "array", "items": log_line},
                "series": {"type": "array", "items": point},
                "sample_interval_s": NUM,
                "totals": {
                    "type": "object",
                    "description": "Running sums since start, the figures GET /metrics renders: `requests` "
                    "(count by model, method, route pattern and status) and `models` (per model: responses by "
                    "outcome, prompt_tokens evaluated, cached_tokens, generated_tokens, and the ttft_seconds and "
                    "inter_token_seconds histograms).",
                },
            }
        ),
        "Settings": settings,
        "SettingsUpdate": update,
        "InputItemList": obj(
            {
                "object": {"const": "list"},
                "data": {"type": "array", "items": {"type": "object"}},
                "first_id": nullable(STR),
                "last_id": nullable(STR),
                "has_more": BOOL,
            }
        ),
    }


def operations() -> dict[str, dict[str, Any]]:
    """The console's paths, and OpenAI's ``GET /responses/{id}/input_items`` on /lmsp/v1."""
    cursor = {
        "name": "after",
        "in": "query",
        "required": False,
        "description": "The `cursor` of the previous answer: only rows and log lines changed since then.",
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_CURSOR},
    }
    return {
        "/lmsp/v1/console/sessions": {
            "post": operation(
                "Exchange a single-use console code (from the URL fragment) for the console's token.",
                None,
                {"201": json_answer("The console token and its secret.", ref("ConsoleSession"))},
                body=json_body(ref("ConsoleSessionCreate"), {"code": CODE_PREFIX + "…"}),
                problems=("401",),
            )
        },
        "/lmsp/v1/console/codes": {
            "post": operation(
                "A console link: its URL carries a code that works once, within a minute (`lmsp-tray open`).",
                "tokens:manage",
                {"201": json_answer("The link.", ref("ConsoleLink"))},
                problems=("429",),
            )
        },
        "/lmsp/v1/console/reveal": {
            "post": operation(
                "Show a model's folder in the desktop's file manager.",
                "models:manage",
                {"200": json_answer("The folder shown.", ref("ConsoleRevealed"))},
                body=json_body(ref("ConsoleReveal"), {"model": "qwen3:14b-q4_k_m"}),
                problems=("404", "409", "503"),
            )
        },
        "/lmsp/v1/activity": {
            "get": operation(
                "Recent requests, a tokens/s and memory series, and the service log (no secrets).",
                "activity:read",
                {"200": json_answer("What changed since `after`.", ref("Activity"))},
                params=[cursor],
                problems=("400",),
            )
        },
        "/metrics": {
            "get": operation(
                "The service's figures in Prometheus's text format (requests by model, route and status; prompt, "
                "cached and generated tokens; time-to-first-token and inter-token histograms; queue, running "
                "sequences, load time and memory of each loaded model; models, downloads, store size). The same "
                "counters as GET /lmsp/v1/activity's `totals`. With `metrics_keyless = true` in config.toml, "
                "no token is needed.",
                "activity:read",
                {
                    "200": {
                        "description": "Prometheus text exposition format 0.0.4.",
                        "content": {"text/plain": {"schema": STR}},
                    }
                },
                problems=("503",),
            )
        },
        "/lmsp/v1/settings": {
            "get": operation(
                "The common config.toml settings, the values in effect, and which need a restart.",
                "settings:manage",
                {"200": json_answer("The settings.", ref("Settings"))},
                problems=("409", "503"),
            ),
            "patch": operation(
                "Change settings: written to config.toml (comments kept) and applied where possible.",
                "settings:manage",
                {"200": json_answer("The settings after the change, with `applied`.", ref("Settings"))},
                body=json_body(ref("SettingsUpdate"), {"keep_alive": "10m"}),
                problems=("409", "503"),
            ),
        },
        "/lmsp/v1/responses/{response_id}/input_items": {
            "get": operation(
                "The input items of a stored response (this turn's own input, as sent).",
                "responses:read",
                {"200": json_answer("The input items.", ref("InputItemList"))},
                params=[path_param("response_id", "A response id (resp_…) stored with `store: true`.")],
                problems=("404",),
            )
        },
    }
