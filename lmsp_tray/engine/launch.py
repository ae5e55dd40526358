"""How the service starts the processes that run llama.cpp: by module name, never by importing them.

Why apart from `process`: the service must never load llama.cpp, so it names the model process's
modules (`lmsp_tray.runner.worker`, `lmsp_tray.runner.probe`) instead of importing them, and
starts them in the folder this very package came from. The frozen program cannot run `-m`: it
starts its own executable with a flag that `lmsp_tray.__main__` dispatches. The LOAD frame's
content — what to load and how — is made here and read back in the model process
(`entry_from_spec`), so both directions of that one message sit together.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry, Projector
from lmsp_tray.engine.load_plan import LoadOptions, LoadPlan

WORKER_MODULE = "lmsp_tray.runner.worker"
PROBE_MODULE = "lmsp_tray.runner.probe"
WORKER_FLAG = "--lmsp-model-worker"  # the frozen program's way to run WORKER_MODULE
PROBE_FLAG = "--lmsp-device-probe"  # ... and PROBE_MODULE


def _command(module: str, flag: str) -> list[str]:
    if getattr(sys, "frozen", False):  # the PyInstaller program: its own executable
        return [sys.executable, flag]
    return [sys.executable, "-m", module]


def worker_command() -> list[str]:
    """How the service starts a model process (run it in `home()`)."""
    return _command(WORKER_MODULE, WORKER_FLAG)


def probe_command() -> list[str]:
    """How the service starts the device probe (run it in `home()`)."""
    return _command(PROBE_MODULE, PROBE_FLAG)


def home() -> str | None:
    """Where a model process starts: the folder this very `lmsp_tray` package was imported from, so
    `-m` finds the same code whatever the service's working directory holds (a frozen program
    carries its code inside: None, the service's own folder)."""
    if getattr(sys, "frozen", False):
        return None
    return str(Path(__file__).resolve().parent.parent.parent)


def load_spec(entry: ModelEntry, options: LoadOptions, plan: LoadPlan, log_level: int) -> dict[str, Any]:
    """The LOAD frame's content."""
    return {
        "entry": {
            "id": entry.id,
            "path": os.path.abspath(entry.path),  # the model process starts in another folder
            "source": entry.source,
            "size_bytes": entry.size_bytes,
            "files": [os.path.abspath(f) for f in entry.files],
            "info": dataclasses.asdict(entry.info) if entry.info else None,
            "projector": (
                {**dataclasses.asdict(entry.projector), "path": os.path.abspath(entry.projector.path)}
                if entry.projector is not None
                else None
            ),
        },
        "options": dataclasses.asdict(options),
        "plan": dataclasses.asdict(plan),
        "log_level": log_level,
    }


def entry_from_spec(data: dict[str, Any]) -> ModelEntry:
    """The model entry of a LOAD frame's `entry` (in the model process)."""
    info = GGUFInfo(**data["info"]) if data.get("info") else None
    return ModelEntry(
        data["id"],
        Path(data["path"]),
        data["source"],
        data["size_bytes"],
        tuple(Path(f) for f in data.get("files") or ()),
        info,
        projector=Projector(**{**data["projector"], "path": Path(data["projector"]["path"])})
        if data.get("projector")
        else None,
    )
