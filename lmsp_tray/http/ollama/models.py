"""Ollama's model endpoints: `GET /` (the probe), `/api/version`, `/api/tags`, `POST /api/show`, `GET /api/ps`.

Why: an app pointed at an Ollama address first probes `GET /` ("Ollama is running"),
then lists `/api/tags` to fill its picker and `/api/show`s a model to learn its
window and what it can do (tools, thinking, embedding, insert). Every model the
service found is listed, loaded or not (a request loads it); `/api/ps` shows the
loaded ones with their memory and when they unload. The fields are Ollama's: a
model's `digest` here names its file (path, size, time) — the service never hashes
gigabytes to list them — and `details` come from the GGUF header.

Names resolve as Ollama's do (`resolve`): the exact id, else the catalog's own
rules (case, `:latest`), else — for a name without a tag — the one model of that
name; several are a clear 404 listing them.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from lmsp_tray import __version__
from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.errors import ModelNotFound, quote
from lmsp_tray.http.api import PUBLIC, Scoped
from lmsp_tray.http.routes import JSON, read_json, sees_paths
from lmsp_tray.protocol.ollama_requests import parse_model_name
from lmsp_tray.protocol.ollama_stream import created_at
from lmsp_tray.serving.service import Service

RUNNING = "Ollama is running"
OLLAMA_VERSION = "0.12.0"  # the Ollama API this door speaks (clients gate features on it)
KEPT_SECONDS = 100 * 365 * 86400.0  # "never unloads", as a date
CAPABILITY_NAMES = {"text": "completion", "tools": "tools", "reasoning": "thinking", "embeddings": "embedding"}


def service_of(request: Request) -> Service:
    return request.app.state.service


def resolve(service: Service, name: str) -> ModelEntry:
    """The model `name` means, as Ollama resolves names; a 404 (listing the candidates when several) if none."""
    entry = service.catalog.resolve(name) or _pulled(service, name)
    if entry is not None:
        return entry
    base = name.strip().lower()
    if ":" not in base.rsplit("/", 1)[-1]:
        candidates = [e for e in service.catalog.entries() if e.id.lower().startswith(base + ":")]
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            names = ", ".join(e.id for e in candidates)
            raise ModelNotFound(
                f"model {quote(name)} not found: {len(candidates)} models have that name ({names}); name one "
                f"with its tag.",
                param="model",
            )
    raise ModelNotFound(
        f"model {quote(name)} not found. GET /api/tags lists the models this service found; POST /api/pull "
        f"downloads one from Hugging Face (hf.co/<org>/<repo>:<quant>).",
        param="model",
    )


def _pulled(service: Service, name: str) -> ModelEntry | None:
    """A model pulled by an Ollama-style Hugging Face name (`hf.co/<org>/<repo>[:<quant>]`), found in the
    Hugging Face cache by its repository's folder and its quantization, so the name pulled runs as it is."""
    text = name.strip()
    for host in ("hf.co/", "huggingface.co/"):
        if text.lower().startswith(host):
            repo, _, quant = text[len(host) :].partition(":")
            folder = "models--" + repo.replace("/", "--")
            found = [
                e
                for e in service.catalog.entries()
                if folder in e.path.parts
                and (not quant or quant.lower() in e.path.name.lower())
                and (e.info is None or e.info.kind == "model")
            ]
            return found[0] if len(found) == 1 else None
    return None


def _modified(entry: ModelEntry) -> float:
    try:
        return os.stat(entry.path).st_mtime
    except OSError:
        return 0.0


def digest(entry: ModelEntry) -> str:
    """A stable 64-hex name for the file (its path, size and time), in Ollama's place for a digest."""
    key = f"{entry.path}\0{entry.size_bytes}\0{_modified(entry)}"
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def _parameter_size(entry: ModelEntry) -> str:
    info = entry.info
    if info is None:
        return ""
    if info.size_label:
        return info.size_label
    count = info.parameter_count
    if not count:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}".replace(".0" + unit, unit)
    return str(count)


def details(entry: ModelEntry) -> dict[str, Any]:
    family = (entry.info.architecture if entry.info else None) or ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": _parameter_size(entry),
        "quantization_level": (entry.info.quantization if entry.info else None) or "",
    }


def capabilities(service: Service, entry: ModelEntry) -> list[str]:
    """Ollama's capability names: completion, tools, thinking, embedding, insert (fill-in-the-middle),
    vision (takes images), audio (takes audio: on /v1/chat/completions and /v1/audio/transcriptions, as
    Ollama's API has no field for it)."""
    found = service.model_capabilities(entry)
    out = [CAPABILITY_NAMES[c] for c in found if c in CAPABILITY_NAMES]
    if "text" in found and entry.info is not None and entry.info.fim_tokens:
        out.append("insert")
    if "text" in found and service.takes_images(entry):  # not while loaded without its projector
        out.append("vision")
    if "text" in found and service.takes_audio(entry):
        out.append("audio")
    return out


def tag(entry: ModelEntry) -> dict[str, Any]:
    return {
        "name": entry.id,
        "model": entry.id,
        "modified_at": created_at(_modified(entry)),
        "size": entry.size_bytes,
        "digest": digest(entry),
        "details": details(entry),
    }


async def running(_request: Request) -> Response:
    return PlainTextResponse(RUNNING)


async def version(_request: Request) -> Response:
    return JSON({"version": OLLAMA_VERSION, "lmsp_tray": __version__})


async def tags(request: Request) -> Response:
    entries = [e for e in service_of(request).catalog.entries() if e.ok]
    return JSON({"models": [tag(e) for e in entries]})


def model_info(service: Service, entry: ModelEntry) -> dict[str, Any]:
    info = entry.info
    arch = (info.architecture if info else None) or "unknown"
    out: dict[str, Any] = {"general.architecture": arch}
    if info is not None:
        values = {
            "general.basename": info.basename,
            "general.parameter_count": info.parameter_count,
            "general.size_label": info.size_label,
            f"{arch}.context_length": info.context_length,
            f"{arch}.embedding_length": info.embedding_length,
            f"{arch}.block_count": info.block_count,
            f"{arch}.attention.head_count": info.head_count,
            f"{arch}.attention.head_count_kv": info.head_count_kv,
            f"{arch}.pooling_type": info.pooling_type,
        }
        out.update({k: v for k, v in values.items() if v is not None})
    return out


async def show(request: Request) -> Response:
    service = service_of(request)
    entry = resolve(service, parse_model_name(await read_json(request)))
    loaded = service.models.get(entry.id)
    window = loaded.context_length if loaded is not None else service.models.context_window(entry)
    where = entry.path if sees_paths(request) else entry.path.name  # full paths to models:manage alone
    return JSON(
        {
            "license": "",
            "modelfile": f"# Served by lmsp-tray from {where}\nFROM {where}\n",
            "parameters": f"num_ctx {window}",
            "template": (entry.info.chat_template if entry.info else None) or "",
            "details": details(entry),
            "model_info": model_info(service, entry),
            "capabilities": capabilities(service, entry),
            "modified_at": created_at(_modified(entry)),
            "context_length": window,
        }
    )


async def ps(request: Request) -> Response:
    service = service_of(request)
    models = []
    for model in service.models.loaded():
        models.append(
            {
                **tag(model.entry),
                "size": model.plan.ram_bytes + model.plan.vram_bytes,
                "size_vram": model.plan.vram_bytes,
                "expires_at": expires_at(service.models.unloads_in(model.id)),
                "context_length": model.context_length,
            }
        )
    return JSON({"models": models})


def expires_at(seconds: float | None) -> str:
    """When a loaded model unloads; one kept loaded shows a date far ahead, as Ollama's does."""
    return created_at(time.time() + (KEPT_SECONDS if seconds is None else seconds))


ROUTES = [
    Scoped("/", running, GET=PUBLIC),
    Scoped("/api/version", version, GET=PUBLIC),
    Scoped("/api/tags", tags, GET="models:read"),
    Scoped("/api/show", show, POST="models:read"),
    Scoped("/api/ps", ps, GET="models:read"),
]
