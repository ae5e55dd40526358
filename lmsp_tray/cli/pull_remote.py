"""`lmsp-tray pull` while the service runs: the download is the service's, the command follows it.

Why: a download the service runs is one the tray shows (progress, a notification
when it ends), the console lists and the service resumes after a restart; a
second process downloading beside it would be invisible to all of that. So when
this home's service answers, the command starts the download with `POST
/lmsp/v1/models/pull` (the owner token, found the way the token commands find
it) and follows the task's event stream, printing the same plan, progress line
and result as a pull in this process. Ctrl+C cancels the task (the part fetched
stays in the cache; the same command resumes). A lost connection reconnects
from the last event seen (`?after=N`). The `POST` carries a fresh
`Idempotency-Key`, and one that loses its connection before the answer is sent
once more with the same key: the service answers with the task the first one
started, so a retry never starts a second download. When the service does not
run, or its token cannot be found, `cli.pull` downloads in this process as before.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from lmsp_tray.cli.progress import INTERRUPTED, Printer, size
from lmsp_tray.cli.service import CommandError, ServiceAPI, ServiceUnreachable, find_service
from lmsp_tray.client.sse import stream_events
from lmsp_tray.hub.pull import PullProgress
from lmsp_tray.protocol import downloads as ev

RECONNECTS = 5
RETRY_AFTER_S = 1.0
IN_PROGRESS_WAIT_S = 120.0  # how long a retry waits for the first POST, still being planned, to finish
READ_TIMEOUT_S = 120.0  # the task stream sends a keep-alive comment far more often than this


def start_pull(api: ServiceAPI, body: dict[str, Any]) -> dict[str, Any]:
    """`POST /models/pull` under a fresh Idempotency-Key, sent once more with that key if the connection
    broke: the service replays the task the first one may have started instead of starting another."""
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    try:
        return api.call("POST", "/models/pull", body, headers=headers)
    except ServiceUnreachable:
        time.sleep(RETRY_AFTER_S)
    deadline = time.monotonic() + IN_PROGRESS_WAIT_S
    while True:
        try:
            return api.call("POST", "/models/pull", body, headers=headers)
        except CommandError as exc:  # the first is still being planned (a slow Hub): wait for its answer
            if exc.code != "idempotency_key_in_progress" or time.monotonic() > deadline:
                raise
        time.sleep(RETRY_AFTER_S)


def _progress(data: dict[str, Any]) -> PullProgress:
    return PullProgress(
        bytes_done=int(data.get("bytes_done") or 0),
        bytes_total=int(data.get("bytes_total") or 0),
        bytes_per_second=data.get("bytes_per_second"),
        eta_seconds=data.get("eta_seconds"),
        file=str(data.get("file") or ""),
        file_bytes_done=int(data.get("file_bytes_done") or 0),
        file_bytes_total=int(data.get("file_bytes_total") or 0),
        files_done=int(data.get("files_done") or 0),
        files_total=int(data.get("files_total") or 0),
        phase=str(data.get("phase") or "downloading"),
    )


def _print_plan(download: dict[str, Any]) -> None:
    print(f"{download.get('model')}: {download.get('reason')}", file=sys.stderr)
    for f in download.get("files") or []:
        role = "  (multimodal projector)" if f.get("role") == "projector" else ""
        print(f"  {f.get('path')}  {size(f.get('size'))}{role}", file=sys.stderr)
    fit = download.get("fit") or {}
    if fit.get("summary"):
        print(f"  On this machine: {fit['summary']}", file=sys.stderr)


def pull_through_service(url: str, token: str, args: Any) -> int:
    """Start the pull in the running service at `url` and follow it to its end."""
    api = ServiceAPI(url, token)
    task = start_pull(api, {"model": args.model, "include_mmproj": not args.no_mmproj})
    task_id = task["id"]
    print(f"The running lmsp-tray downloads it (task {task_id}); the tray shows its progress.", file=sys.stderr)
    printer = Printer()
    started = time.monotonic()
    last, terminal = 0, None
    try:
        for _attempt in range(RECONNECTS):
            try:
                events = stream_events(
                    f"{url}/tasks/{task_id}/events?after={last}", token=token, timeout=READ_TIMEOUT_S
                )
                for event in events:
                    last = max(last, int(event.id or 0))
                    name, data = event.event, event.json()
                    if name == ev.CREATED:
                        _print_plan(data.get("download") or {})
                    elif name == ev.PROGRESS:
                        printer.progress(_progress(data))
                    elif name == ev.PAUSED:
                        printer.end_line()
                        print("The service stopped; the download resumes when it starts again.", file=sys.stderr)
                        return 1
                    elif name in ev.TERMINAL:
                        terminal = (name, data)
                        break
                if terminal is not None:
                    break
            except (OSError, ValueError):
                time.sleep(1.0)  # the connection dropped: continue after the last event seen
    except KeyboardInterrupt:
        printer.end_line()
        try:
            api.call("POST", f"/tasks/{task_id}/cancel")
        except CommandError as exc:
            print(f"lmsp-tray: could not cancel the download: {exc}", file=sys.stderr)
            return INTERRUPTED
        print(
            "Stopped. What was fetched is kept in the Hugging Face cache; run the same command to resume.",
            file=sys.stderr,
        )
        return INTERRUPTED
    if terminal is None:
        printer.end_line()
        print(f"lmsp-tray: lost the download's progress; `lmsp-tray` shows it (task {task_id}).", file=sys.stderr)
        return 1
    name, data = terminal
    if name == ev.COMPLETED:
        download = data.get("download") or {}
        total = int(download.get("total_bytes") or 0)
        files = download.get("files") or [{}]
        done = {"bytes_done": total, "bytes_total": total, "file": files[-1].get("path"), "phase": "done"}
        printer.progress(_progress(done), force=True)  # the whole bar, however few progress events came
        printer.end_line()
        return _report(data, time.monotonic() - started)
    printer.end_line()
    if name == ev.CANCELLED:
        print("Stopped (cancelled from the tray, the console or the API).", file=sys.stderr)
        return INTERRUPTED
    error = data.get("error") or {}
    print(f"lmsp-tray: {error.get('detail') or 'the download failed'}", file=sys.stderr)
    return 1


def _report(data: dict[str, Any], seconds: float) -> int:
    download = data.get("download") or {}
    total = int(download.get("total_bytes") or 0)
    print(f"Downloaded and verified {size(total)} in {seconds:.1f} s.", file=sys.stderr)
    model = data.get("model") or {}
    model_id = model.get("id")
    path = ((model.get("extensions") or {}).get("lmsp_tray") or {}).get("path")
    if model_id:
        print(f"Model: {model_id}", file=sys.stderr)
    else:
        print("The running lmsp-tray does not scan the Hugging Face cache (default_dirs = false).", file=sys.stderr)
    if path:
        print(f"File: {path}", file=sys.stderr)
    fit = download.get("fit") or {}
    if fit.get("summary"):
        print(f"On this machine: {fit['summary']}", file=sys.stderr)
    print(model_id or path or download.get("model") or "")
    return 0


def running_service(paths: Any) -> tuple[str, str] | None:
    """(URL, token) of this home's running service, or None (not running, or no token to reach it)."""
    try:
        return find_service(paths)
    except CommandError:
        return None
