"""`POST /lmsp/v1/models/pull`: start downloading a model from Hugging Face, as a task.

A thin handler like the others: read the body, let `serving.downloads` plan
the pull and check the disk (a bad name, a gated repository or a full disk is
this request's problem document), answer `202` with the task and its
`Location`. An `Idempotency-Key` works as on `POST /tasks`: a retry gets the
same task (`Idempotent-Replayed: true`), never a second download. Progress,
cancel and the result go through the task endpoints (`GET /tasks/{id}/events`,
`POST /tasks/{id}/cancel`, `GET /tasks/{id}`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.errors import ServiceUnavailable
from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, REPLAYED, caller_of, idempotency_key, read_json
from lmsp_tray.serving.downloads import DownloadTasks
from lmsp_tray.serving.tasks import task_object

BASE = "/lmsp/v1"


def _downloads(request: Request) -> DownloadTasks:
    downloads = getattr(request.app.state, "downloads", None)
    if downloads is None:
        raise ServiceUnavailable("This service runs without its store; downloads are not available.")
    return downloads


async def pull_model(request: Request) -> Response:
    body = await read_json(request)
    downloads = _downloads(request)
    task, replayed = await downloads.create(body, caller=caller_of(request), key=idempotency_key(request))
    headers = {"Location": f"{BASE}/tasks/{task.id}", **(REPLAYED if replayed else {})}
    return JSON(task_object(task), status_code=202, headers=headers)


# Under /lmsp/v1, before `/models/{model_id:path}`: "pull" is this endpoint, not a model id.
DOWNLOAD_ROUTES = [Scoped("/models/pull", pull_model, POST="models:manage")]
