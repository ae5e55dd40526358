"""`lmsp-tray models set <id> key=value …` (a model's own settings) and `models rm <id>` (delete one).

Why a module of its own: these change the person's models, through the running service when
there is one (so the change is applied there too and the console shows it), else in this process
on the same files: `serving.model_settings` writes config.toml (the service reads it when it
starts). A value is read as TOML (``temperature=0.2``, ``speculative=false``, ``keep_alive="10m"``),
and as plain text where it is not TOML (``system_prompt=Answer briefly``); an empty value
(``context=``) removes the setting, so the service-wide one applies again. `models rm` goes through
the running service only (it knows what is loaded and generating, and which files are its own).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from typing import Any

from lmsp_tray.config import Config, Paths

ASSIGNMENT_HELP = "KEY=VALUE: context, keep_alive, parallel, gpu_layers, speculative, temperature, top_k, top_p, "
ASSIGNMENT_HELP += "min_p, repeat_penalty, system_prompt (an empty VALUE removes it)"


def add_parsers(models: argparse.ArgumentParser) -> None:
    """`models set` and `models rm` under the `models` command (which alone still lists the models)."""
    actions = models.add_subparsers(dest="models_command", metavar="ACTION")
    change = actions.add_parser("set", help="set a model's own settings (applied at its next load)")
    change.add_argument("model", help="the model id (as `lmsp-tray models` lists it)")
    change.add_argument("assignments", nargs="+", metavar="KEY=VALUE", help=ASSIGNMENT_HELP)
    remove = actions.add_parser("rm", help="delete a model the service downloaded or keeps in its own folder")
    remove.add_argument("model", help="the model id (as `lmsp-tray models` lists it)")
    remove.add_argument("--force", action="store_true", help="delete it even while it generates")


def parse_assignments(assignments: list[str]) -> dict[str, Any]:
    """``["temperature=0.2", "context="]`` as ``{"temperature": 0.2, "context": None}``."""
    changes: dict[str, Any] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        changes[key.strip()] = _value(text.strip())
    return changes


def _value(text: str) -> Any:
    if not text:
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def run(paths: Paths, config: Config, args: argparse.Namespace) -> int:
    from lmsp_tray.cli.service import CommandError

    if args.models_command == "rm":
        try:
            removed = _remove(paths, args.model, force=args.force)
        except CommandError as exc:
            print(f"lmsp-tray: {exc}", file=sys.stderr)
            return 1
        print(f"Deleted {removed['id']} ({removed['freed_bytes'] / 1e6:.1f} MB freed):")
        for file in removed["files"]:
            print(f"  {file}")
        return 0
    try:
        changes = parse_assignments(args.assignments)
        settings = _set(paths, config, args.model, changes)
    except ValueError as exc:
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return 1
    values = {k: v for k, v in settings.get("values", {}).items() if v is not None}
    print(f"{args.model}: {json.dumps(values, ensure_ascii=False) if values else 'no settings of its own'}")
    print("Load settings (context, keep_alive, parallel, gpu_layers, speculative) apply at its next load.")
    return 0


def _remove(paths: Paths, model: str, *, force: bool) -> dict[str, Any]:
    """Through the running service only: it knows what is loaded or generating, and owns the files."""
    from lmsp_tray.cli.service import CommandError, ServiceAPI, find_service, quote_part

    found = find_service(paths)
    if found is None:
        raise CommandError("lmsp-tray is not running; start it (`lmsp-tray serve`) and run this again")
    return dict(ServiceAPI(*found).call("DELETE", f"/models/{quote_part(model)}" + ("?force=true" if force else "")))


def _set(paths: Paths, config: Config, model: str, changes: dict[str, Any]) -> dict[str, Any]:
    """The model's settings after the change: through the running service, else in config.toml here."""
    from lmsp_tray.cli.service import CommandError, ServiceAPI, find_service, quote_part

    found = find_service(paths)
    if found is not None:
        doc = ServiceAPI(*found).call("PATCH", f"/models/{quote_part(model)}/settings", changes)
        return dict(doc["extensions"]["lmsp_tray"]["settings"])
    from lmsp_tray.discovery.catalog import Catalog
    from lmsp_tray.errors import LMSPError
    from lmsp_tray.serving.model_settings import ModelSettingsEditor, settings_document
    from lmsp_tray.serving.settings import Settings

    catalog = Catalog.from_config(paths, config)
    catalog.scan()
    entry = catalog.resolve(model)
    if entry is None:
        raise CommandError(f"no model {model!r} is found; `lmsp-tray models` lists them")
    editor = ModelSettingsEditor(Settings(paths, lambda: config))
    try:
        own = editor.update(entry.id, changes)
    except LMSPError as exc:
        raise CommandError(f"{exc.detail} ({exc.code})", code=exc.code) from None
    return settings_document(own)
