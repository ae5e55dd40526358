"""The OpenAPI description of model downloads: `POST /models/pull`, the download object, its events.

A surface of its own (`lmsp` puts its path among LMSP's) so the download API is described
in one place: the request body, the task's `download` member, the
``model.download.*`` events a download task's stream carries
(`protocol.downloads`), and the problems only a pull has (`hub.errors`).
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.http.openapi.parts import (
    BOOL,
    IDEMPOTENCY_KEY,
    INT,
    STR,
    accepted_task,
    event_schema_name,
    json_body,
    nullable,
    obj,
    operation,
    ref,
)
from lmsp_tray.protocol import downloads as ev

PROGRESS_FIELDS = {
    "phase": {"enum": ["checking", "downloading", "waiting", "verifying"]},
    "bytes_done": INT,
    "bytes_total": INT,
    "bytes_per_second": nullable(INT),
    "eta_seconds": nullable(INT),
    "file": STR,
    "file_bytes_done": INT,
    "file_bytes_total": INT,
    "files_done": INT,
    "files_total": INT,
}

EVENTS: dict[str, dict[str, Any]] = {
    ev.CREATED: {"status": STR, "download": ref("ModelDownload")},
    ev.STARTED: {"bytes_done": INT, "resumed": BOOL},
    ev.PROGRESS: PROGRESS_FIELDS,
    ev.PAUSED: {"reason": {"enum": ["service_stopped", "service_restarted"]}, "bytes_done": INT},
    ev.COMPLETED: {"status": STR, "download": ref("ModelDownload"), "model": nullable(ref("Model"))},
    ev.FAILED: {"status": STR, "download": ref("ModelDownload"), "error": ref("Problem")},
    ev.CANCELLED: {"status": STR, "download": ref("ModelDownload"), "bytes_kept": INT},
}


def schemas() -> dict[str, Any]:
    fit = obj(
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
    file = obj(
        {"path": STR, "size": INT, "role": {"enum": ["model", "projector"]}},
        {"sha256": nullable(STR), "blob_id": nullable(STR)},
    )
    download = obj(
        {
            "object": {"const": "model.download"},
            "model": {"type": "string", "description": "The model as named, normalised (hf.co/org/repo:QUANT)."},
            "repository": STR,
            "revision": STR,
            "commit": STR,
            "quantization": nullable(STR),
            "reason": {"type": "string", "description": "Why this variant (e.g. Q4_K_M, the default)."},
            "files": {"type": "array", "items": ref("DownloadFile")},
            "total_bytes": INT,
            "fit": nullable(ref("MemoryFit")),
            "progress": nullable(ref("DownloadProgress")),
        },
        {"model_id": nullable(STR), "fetched_bytes": INT, "already_present": BOOL},
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
                "description": "Also fetch the projector (mmproj) of a vision or audio model.",
            },
        },
    }
    out: dict[str, Any] = {
        "ModelPull": pull,
        "ModelDownload": download,
        "DownloadFile": file,
        "DownloadProgress": obj(PROGRESS_FIELDS),
        "MemoryFit": fit,
    }
    for event, fields in EVENTS.items():
        out[event_schema_name(event)] = obj(
            {"type": {"const": event}, "sequence_number": INT, "task_id": STR, **fields}
        )
    return out


def stream_note() -> str:
    return (
        f" A download task (kind `{ev.KIND}`) carries instead: {', '.join(EVENTS)} (schemas `Event_model_download_*`);"
        " its terminal event is one of model.download.completed, model.download.failed, model.download.cancelled."
    )


def operations(example: str) -> dict[str, Any]:
    """`POST /lmsp/v1/models/pull`; `example`: the model its example body pulls."""
    accepted = accepted_task("The download task, started (or, replayed, the one this Idempotency-Key started).")
    return {
        "/lmsp/v1/models/pull": {
            "post": operation(
                "Download a GGUF model from Hugging Face into the shared cache, as a task: follow it with "
                "GET /tasks/{id}/events (scope tasks:read), cancel it with POST /tasks/{id}/cancel (the part "
                "fetched is kept; pulling again resumes). The finished model is in GET /models. With an "
                "Idempotency-Key a retry gets the same task, never a second download.",
                "models:manage",
                {"202": accepted},
                body=json_body(ref("ModelPull"), {"model": example}),
                params=[IDEMPOTENCY_KEY],
                problems=("404", "409", "422", "502", "503", "507"),
            )
        }
    }
