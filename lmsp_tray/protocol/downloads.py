"""The events of a model download task (`POST /lmsp/v1/models/pull`), built in one place.

A download is a task of kind ``model.download``: the same resumable event
stream as a background response (`GET /tasks/{id}/events`, integer ids from
1, `Last-Event-ID` / `?after=N`), with its own event names. Every event's data
carries ``type`` (its name), ``sequence_number`` (its id) and ``task_id``:

- ``model.download.created`` {download}: the plan — repository, commit,
  variant and why, files and sizes, fit on this machine (first event);
- ``model.download.started`` {bytes_done, resumed}: the transfer began (again
  after a pause: ``resumed: true``);
- ``model.download.progress`` {phase, bytes_done, bytes_total,
  bytes_per_second, eta_seconds, file, file_bytes_done, file_bytes_total,
  files_done, files_total}: at most about once a second, and on each change of
  phase or file;
- ``model.download.paused`` {reason, bytes_done}: the service stopped
  (``service_stopped``) or died (``service_restarted``); the part fetched is
  kept and the download resumes when the service starts again;
- terminal, exactly one: ``model.download.completed`` {download, model} (the
  model object as `GET /models/{id}` shows it, or null when this service does
  not scan the Hugging Face cache), ``model.download.failed`` {download,
  error} (a problem document) or ``model.download.cancelled`` {download,
  bytes_kept}.
"""

from __future__ import annotations

from typing import Any

from lmsp_tray.protocol.events import Event

KIND = "model.download"
CREATED = "model.download.created"
STARTED = "model.download.started"
PROGRESS = "model.download.progress"
PAUSED = "model.download.paused"
COMPLETED = "model.download.completed"
FAILED = "model.download.failed"
CANCELLED = "model.download.cancelled"
EVENT_NAMES = (CREATED, STARTED, PROGRESS, PAUSED, COMPLETED, FAILED, CANCELLED)
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})


def download_event(seq: int, name: str, task_id: str, **fields: Any) -> Event:
    return Event(seq, name, {"type": name, "sequence_number": seq, "task_id": task_id, **fields})
