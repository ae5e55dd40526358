"""The OpenAPI description of the console's endpoints (`console_routes`), merged into `openapi`.

Kept apart so the main document stays readable: these endpoints are
lmsp-tray's own (the console's code exchange, the activity log, the settings
form, "open folder") plus OpenAI's ``GET /responses/{id}/input_items``.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.auth.console import CODE_PREFIX
from lmsp_tray.http.openapi import _body, _json, _op, _path_param
from lmsp_tray.http.openapi_parts import BOOL, INT, NULL, STR
from lmsp_tray.http.openapi_parts import nullable as _nullable
from lmsp_tray.http.openapi_parts import obj as _obj
from lmsp_tray.http.openapi_parts import ref as _ref
from lmsp_tray.http.openapi_schemas import SCOPE

NUMBER = {"type": "number"}
MAX_CURSOR = 10**15 - 1


def _nullable_any(*schemas: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*schemas, NULL]}


def console_schemas() -> dict[str, Any]:
    request_row = _obj(
        {
            "id": INT,
            "seq": INT,
            "time": NUMBER,
            "method": STR,
            "endpoint": STR,
            "app": _nullable(STR),
            "status": _nullable(INT),
            "duration_ms": _nullable(NUMBER),
            "model": _nullable(STR),
            "outcome": _nullable(STR),
            "tokens_in": _nullable(INT),
            "tokens_out": _nullable(INT),
            "cached_tokens": _nullable(INT),
            "ttft_ms": _nullable(NUMBER),
            "tokens_per_s": _nullable(NUMBER),
            "done": BOOL,
        }
    )
    log_line = _obj({"seq": INT, "time": NUMBER, "level": STR, "logger": STR, "message": STR})
    point = _obj({"time": NUMBER, "tokens_per_s": NUMBER, "rss_bytes": _nullable(INT), "models_bytes": INT})
    field = _obj(
        {
            "key": STR,
            "label": STR,
            "kind": STR,
            "help": STR,
            "applies": {"enum": ["restart", "now", "next_load"]},
        },
        {"choices": {"type": "array", "items": STR}},
    )
    settings = _obj(
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
            "port": _nullable({"type": "integer", "minimum": 1, "maximum": 65535}),
            "models_dirs": _nullable({"type": "array", "items": STR}),
            "default_dirs": _nullable(BOOL),
            "keep_alive": _nullable_any(STR, NUMBER),
            "context_cap": _nullable({"type": "integer", "minimum": 1}),
            "parallel": _nullable({"type": "integer", "minimum": 1}),
            "max_loaded_models": _nullable({"type": "integer", "minimum": 1}),
            "gpu": _nullable({"enum": ["auto", "off"]}),
            "start_at_login": BOOL,
        },
    }
    return {
        "ConsoleSessionCreate": _obj({"code": {"type": "string", "pattern": f"^{CODE_PREFIX}"}}),
        "ConsoleSession": _obj(
            {
                "object": {"const": "console.session"},
                "token": {"type": "string", "pattern": "^lmsp_"},
                "token_id": STR,
                "name": STR,
                "scopes": {"type": "array", "items": SCOPE},
            }
        ),
        "ConsoleLink": _obj({"object": {"const": "console.link"}, "url": STR, "expires_at": INT}),
        "ConsoleReveal": _obj({"model": STR}),
        "ConsoleRevealed": _obj({"object": {"const": "console.reveal"}, "model": STR, "folder": STR}),
        "Activity": _obj(
            {
                "object": {"const": "activity"},
                "cursor": INT,
                "requests": {"type": "array", "items": request_row},
                "log": {"type": "array", "items": log_line},
                "series": {"type": "array", "items": point},
                "sample_interval_s": NUMBER,
            }
        ),
        "Settings": settings,
        "SettingsUpdate": update,
        "InputItemList": _obj(
            {
                "object": {"const": "list"},
                "data": {"type": "array", "items": {"type": "object"}},
                "first_id": _nullable(STR),
                "last_id": _nullable(STR),
                "has_more": BOOL,
            }
        ),
    }


def console_operations() -> dict[str, dict[str, Any]]:
    cursor = {
        "name": "after",
        "in": "query",
        "required": False,
        "description": "The `cursor` of the previous answer: only rows and log lines changed since then.",
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_CURSOR},
    }
    return {
        "/lmsp/v1/console/sessions": {
            "post": _op(
                "Exchange a single-use console code (from the URL fragment) for the console's token.",
                None,
                {"201": _json("The console token and its secret.", _ref("ConsoleSession"))},
                body=_body(_ref("ConsoleSessionCreate"), {"code": CODE_PREFIX + "…"}),
                problems=("401",),
            )
        },
        "/lmsp/v1/console/codes": {
            "post": _op(
                "A console link: its URL carries a code that works once, within a minute (`lmsp-tray open`).",
                "tokens:manage",
                {"201": _json("The link.", _ref("ConsoleLink"))},
                problems=("429",),
            )
        },
        "/lmsp/v1/console/reveal": {
            "post": _op(
                "Show a model's folder in the desktop's file manager.",
                "models:manage",
                {"200": _json("The folder shown.", _ref("ConsoleRevealed"))},
                body=_body(_ref("ConsoleReveal"), {"model": "qwen3:14b-q4_k_m"}),
                problems=("404", "409", "503"),
            )
        },
        "/lmsp/v1/activity": {
            "get": _op(
                "Recent requests, a tokens/s and memory series, and the service log (no secrets).",
                "activity:read",
                {"200": _json("What changed since `after`.", _ref("Activity"))},
                params=[cursor],
                problems=("400",),
            )
        },
        "/lmsp/v1/settings": {
            "get": _op(
                "The common config.toml settings, the values in effect, and which need a restart.",
                "settings:manage",
                {"200": _json("The settings.", _ref("Settings"))},
                problems=("409", "503"),
            ),
            "patch": _op(
                "Change settings: written to config.toml (comments kept) and applied where possible.",
                "settings:manage",
                {"200": _json("The settings after the change, with `applied`.", _ref("Settings"))},
                body=_body(_ref("SettingsUpdate"), {"keep_alive": "10m"}),
                problems=("409", "503"),
            ),
        },
        "/lmsp/v1/responses/{response_id}/input_items": {
            "get": _op(
                "The input items of a stored response (this turn's own input, as sent).",
                "responses:read",
                {"200": _json("The input items.", _ref("InputItemList"))},
                params=[_path_param("response_id", "A response id (resp_…) stored with `store: true`.")],
                problems=("404",),
            )
        },
    }
