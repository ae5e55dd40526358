"""`GET /metrics`: the service's figures for Prometheus (scope `activity:read`, or no token at all with
`metrics_keyless = true`).

Why at the root: `/metrics` is where Prometheus's scrape configs look by default,
as on llama-server and vLLM. The figures are the activity log's running totals
and what the loaded models say about themselves now (`serving.metrics`
renders them); asking a model process for its queue is a call over its pipe,
so the gauges are gathered off the event loop.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import LMSPError, ServiceUnavailable
from lmsp_tray.http.api import PathsApi, Scoped
from lmsp_tray.http.problems import PROBLEMS
from lmsp_tray.serving.hardware import memory_by_device
from lmsp_tray.serving.metrics import CONTENT_TYPE, ModelGauges, ServiceGauges, render
from lmsp_tray.serving.service import Service

METRICS_PATHS = ("/metrics",)


def _gauges(service: Service, downloads: object, store_bytes: int | None) -> ServiceGauges:
    models: list[ModelGauges] = []
    for model in service.models.loaded():
        try:
            stats = model.stats()
        except LMSPError:  # unloading or gone meanwhile
            continue
        devices = memory_by_device(model.plan, service.models.devices)
        memory = [(str(d["type"]) + ":" + str(d["name"]), int(d["memory_bytes"])) for d in devices]
        models.append(
            ModelGauges(
                model.id,
                model.load_seconds,
                stats.queued,
                stats.generating,
                memory,
                stats.drafted,
                stats.accepted,
                stats.model_drafted,
                stats.model_accepted,
            )
        )
    active = getattr(downloads, "active", None)
    return ServiceGauges(
        models_available=len(service.catalog.entries()),
        models=models,
        downloads_active=len(active()) if callable(active) else 0,
        store_bytes=store_bytes,
        generated_tokens=service.output_tokens(),
    )


async def metrics(request: Request) -> Response:
    console = request.app.state.console
    if console.activity is None:
        raise ServiceUnavailable("This service runs without an activity log.")
    service: Service = request.app.state.service
    store_bytes = console.store_bytes() if console.store_bytes is not None else None
    gauges = await asyncio.to_thread(_gauges, service, request.app.state.downloads, store_bytes)
    return Response(render(console.activity.totals(), gauges), media_type=CONTENT_TYPE)


METRICS = PathsApi("", [Scoped("/metrics", metrics, GET="activity:read")], errors=PROBLEMS)
