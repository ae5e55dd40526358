"""The OpenAPI description of model downloads: `POST /models/pull`, the download object, its events.

Kept beside `openapi` (which merges it in) so the download API is described
in one place: the request body, the task's `download` member, the
``model.download.*`` events a download task's stream carries
(`protocol.downloads`), and the problems only a pull has (`hub.errors`).
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.openapi_parts import BOOL, INT, STR
from lmsp_tray.http.openapi_parts import nullable as _nullable
from lmsp_tray.http.openapi_parts import obj as _obj
from lmsp_tray.http.openapi_parts import ref as _ref
from lmsp_tray.protocol import downloads as ev

PROGRESS_FIELDS = {
    "phase": {"enum": ["checking", "downloading", "waiting", "verifying"]},
    "bytes_done": INT,
    "bytes_total": INT,
    "bytes_per_second": _nullable(INT),
    "eta_seconds": _nullable(INT),
    "file": STR,
    "file_bytes_done": INT,
    "file_bytes_total": INT,
    "files_done": INT,
    "files_total": INT,
}

EVENTS: dict[str, dict[str, Any]] = {
    ev.CREATED: {"status": STR, "download": _ref("ModelDownload")},
    ev.STARTED: {"bytes_done": INT, "resumed": BOOL},
    ev.PROGRESS: PROGRESS_FIELDS,
    ev.PAUSED: {"reason": {"enum": ["service_stopped", "service_restarted"]}, "bytes_done": INT},
    ev.COMPLETED: {"status": STR, "download": _ref("ModelDownload"), "model": _nullable(_ref("Model"))},
    ev.FAILED: {"status": STR, "download": _ref("ModelDownload"), "error": _ref("Problem")},
    ev.CANCELLED: {"status": STR, "download": _ref("ModelDownload"), "bytes_kept": INT},
}


def event_schema_name(event: str) -> str:
    return "Event_" + event.replace(".", "_")


def schemas() -> dict[str, Any]:
    fit = _obj(
        {
            "verdict": {"enum": ["full_gpu_offload", "partial_gpu_offload", "fits_in_ram", "too_large"]},
            "summary": STR,
            "ram_bytes": INT,
            "vram_bytes": INT,
            "gpu_layers": INT,
            "total_layers": INT,
            "context_length": INT,
            "estimated_from": {"enum": ["header", "size"]},
        }
    )
    file = _obj(
        {"path": STR, "size": INT, "role": {"enum": ["model", "projector"]}},
        {"sha256": _nullable(STR), "blob_id": _nullable(STR)},
    )
    download = _obj(
        {
            "object": {"const": "model.download"},
            "model": {"type": "string", "description": "The model as named, normalised (hf.co/org/repo:QUANT)."},
            "repository": STR,
            "revision": STR,
            "commit": STR,
            "quantization": _nullable(STR),
            "reason": {"type": "string", "description": "Why this variant (e.g. Q4_K_M, the default)."},
            "files": {"type": "array", "items": _ref("DownloadFile")},
            "total_bytes": INT,
            "fit": _nullable(_ref("MemoryFit")),
            "progress": _nullable(_ref("DownloadProgress")),
        },
        {"model_id": _nullable(STR), "fetched_bytes": INT, "already_present": BOOL},
    )
    pull = {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": {
                "type": "string",
                "minLength": 1,
                "maxLength": 2048,
                "description": "hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT], ORG/REPO/FILE.gguf or a "
                "https://huggingface.co/…/resolve/… URL. Without QUANT: Q4_K_M when the repository has it.",
            },
            "include_mmproj": {
                "type": "boolean",
                "default": True,
                "description": "Also fetch the vision projector (mmproj) of a vision model.",
            },
        },
    }
    out: dict[str, Any] = {
        "ModelPull": pull,
        "ModelDownload": download,
        "DownloadFile": file,
        "DownloadProgress": _obj(PROGRESS_FIELDS),
        "MemoryFit": fit,
    }
    for event, fields in EVENTS.items():
        out[event_schema_name(event)] = _obj(
            {"type": {"const": event}, "sequence_number": INT, "task_id": STR, **fields}
        )
    return out


def stream_note() -> str:
    return (
        f" A download task (kind `{ev.KIND}`) carries instead: {', '.join(EVENTS)} (schemas `Event_model_download_*`);"
        " its terminal event is one of model.download.completed, model.download.failed, model.download.cancelled."
    )


def operations(example: str) -> dict[str, Any]:
    """`POST /lmsp/v1/models/pull`, built with `openapi`'s helpers (imported here: it imports this module)."""
    from lmsp_tray.http import openapi as o

    accepted = o._json(
        "The download task, started (or, replayed, the one this Idempotency-Key started).", o._ref("Task")
    )
    accepted["headers"] = {
        **accepted["headers"],
        **o.REPLAYED_HEADER,
        "Location": {"required": True, "schema": STR, "description": "/lmsp/v1/tasks/{id}"},
    }
    return {
        "/lmsp/v1/models/pull": {
            "post": o._op(
                "Download a GGUF model from Hugging Face into the shared cache, as a task: follow it with "
                "GET /tasks/{id}/events (scope tasks:read), cancel it with POST /tasks/{id}/cancel (the part "
                "fetched is kept; pulling again resumes). The finished model is in GET /models. With an "
                "Idempotency-Key a retry gets the same task, never a second download.",
                "models:manage",
                {"202": accepted},
                body=o._body(_ref("ModelPull"), {"model": example}),
                params=[o.IDEMPOTENCY_KEY],
                problems=("404", "409", "422", "502", "503", "507"),
            )
        }
    }
