"""One model's own settings: shown, changed in config.toml, and applied to its loads and requests.

Why here: a model's ``[models."<id>"]`` table in config.toml (`config.ModelSettings`) is read by
the engine (context, keep-alive, parallel sequences, GPU layers, speculative decoding, the draft model: at the
model's next load, through `engine.load_plan.ModelLoad`) and by the requests to it (the default
sampling and system prompt: a request's own parameters always win), and edited from the console,
`lmsp-tray models set` and ``PATCH /lmsp/v1/models/{id}/settings``. Changes are checked by
config.toml's own rules, written through `Settings.edit` (comments and every other key kept, one
atomic rename), then handed to the running service.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import tomlkit
import tomlkit.items

from lmsp_tray.config import MODEL_SETTING_KEYS, Config, ConfigError, ModelSettings, config_from_mapping
from lmsp_tray.engine.load_plan import ModelLoad
from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.requests import Message, ResponseRequest
from lmsp_tray.serving.settings import Settings, shown

LOAD_KEYS = ("context", "keep_alive", "parallel", "gpu_layers", "speculative", "draft")  # from the model's next load
UNSET = ModelSettings()


def model_loads(models: Mapping[str, ModelSettings]) -> dict[str, ModelLoad]:
    """The load settings of each model that has any, as the model manager takes them."""
    loads = {
        model_id: ModelLoad(
            context=own.context,
            parallel=own.parallel,
            gpu_layers=own.gpu_layers,
            speculative=own.speculative,
            keep_alive=own.keep_alive,
            draft=own.draft,
        )
        for model_id, own in models.items()
    }
    return {model_id: load for model_id, load in loads.items() if load != ModelLoad()}


def settings_document(own: ModelSettings | None) -> dict[str, Any]:
    """A model's settings as `GET /models/{id}` shows them: every key, null where unset (the
    service-wide setting or the built-in default applies), and when each takes effect."""
    own = own or UNSET
    values = {key: _shown(key, getattr(own, key)) for key in MODEL_SETTING_KEYS}
    return {
        "values": values,
        "applies": {key: "next_load" if key in LOAD_KEYS else "next_request" for key in MODEL_SETTING_KEYS},
    }


def _shown(key: str, value: Any) -> Any:
    if key == "keep_alive" and value is not None:
        return shown(key, None if math.isinf(value) else value)
    return value


def with_model_defaults(request: ResponseRequest, own: ModelSettings | None) -> ResponseRequest:
    """`request` with its model's default sampling and system prompt where it sets none of its own."""
    if own is None or own == UNSET:
        return request
    changes: dict[str, Any] = {}
    for key in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty"):
        if getattr(request, key) is None and getattr(own, key) is not None:
            changes[key] = getattr(own, key)
    has_system = any(isinstance(item, Message) and item.role == "system" for item in request.items)
    if own.system_prompt and request.completion is None and request.items and not has_system:
        changes["items"] = [Message("system", own.system_prompt), *request.items]
    return dataclasses.replace(request, **changes) if changes else request


class ModelSettingsEditor:
    """Changes models' own settings in config.toml and hands them to the running service."""

    def __init__(self, settings: Settings, apply: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        self.settings = settings
        self.apply = apply

    def update(self, model_id: str, changes: Mapping[str, Any]) -> ModelSettings | None:
        """Set (a value) or remove (null) `model_id`'s settings; 400 naming the first bad one (nothing
        written). Returns the model's settings now (None: it has none left). Blocking: file work."""
        if not isinstance(changes, Mapping) or not changes:
            raise InvalidRequest('Send a JSON object of settings to change, e.g. {"temperature": 0.2}.')
        clean: dict[str, Any] = {}
        for key, value in changes.items():
            name = str(key).replace("-", "_")
            if name not in MODEL_SETTING_KEYS:
                raise InvalidRequest(
                    f"'{str(key)[:40]}' is not a model setting; the settings are {', '.join(MODEL_SETTING_KEYS)}.",
                    param=str(key)[:64],
                )
            clean[name] = value
        check = {k: v for k, v in clean.items() if v is not None}
        try:
            config_from_mapping({"models": {model_id: check}}, source="settings")
        except ConfigError as exc:
            raise InvalidRequest(exc.detail, param=(exc.setting or "").rsplit(".", 1)[-1] or None) from None

        def change(doc: tomlkit.TOMLDocument) -> None:
            _edit_table(doc, model_id, clean)

        with self.settings.lock:
            config: Config = self.settings.edit(change)
            if self.apply is not None:
                self.apply({"models": config.models})
        return config.models.get(model_id)


def _edit_table(doc: tomlkit.TOMLDocument, model_id: str, changes: Mapping[str, Any]) -> None:
    """`[models."<model_id>"]` in `doc` with `changes` made (None removes a key); an emptied table goes."""
    models = doc.get("models")
    if models is None:
        if all(value is None for value in changes.values()):
            return
        models = tomlkit.table(is_super_table=True)
        doc["models"] = models
    table = models.get(model_id)
    if table is None:
        table = tomlkit.table()
        models[model_id] = table
    for key, value in changes.items():
        spelled = next((k for k in list(table.keys()) if k.replace("-", "_") == key), key)
        if value is None:
            if spelled in table:
                del table[spelled]
        else:
            table[spelled] = value
    if not table:
        del models[model_id]
    if not models:
        del doc["models"]
