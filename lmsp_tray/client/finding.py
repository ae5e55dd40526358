"""Finding this home's running service from another process: where it says it listens, if it answers.

Why: apps (`lmsp_tray.connect`), the CLI (`tokens`, `pull`, `open`) and a second launch all ask
"does lmsp-tray run for this home, and where?", and must get one answer. It is: the URL the
service published next to its lock (`instance.json`), else the one in its discovery file
(`service.json`), each only when its process lives and an lmsp-tray service document is served
there. The files, the lock and the pids are `lmsp_tray.instance`'s; this module adds the asking
over HTTP (through `client.loopback`). Apps may also name the service (`given`: a URL or
``LMSP_TRAY_URL``) or fall back to the default port (`find_root`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from lmsp_tray.client.loopback import check_loopback, request
from lmsp_tray.config import Paths, resolve_paths
from lmsp_tray.instance import SERVICE, pid_alive, read_info

API = "/lmsp/v1"


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether an lmsp-tray service document is served at `url` (the API's root, ``…/lmsp/v1``)."""
    try:
        reply = request("GET", url, timeout=timeout)
    except (OSError, ValueError):
        return False
    doc = reply.doc()
    return reply.status == 200 and isinstance(doc, dict) and doc.get("object") == "service"


@dataclass(frozen=True)
class RunningInstance:
    url: str  # the API's root, ``http://127.0.0.1:PORT/lmsp/v1``
    pid: int


def find_running(paths: Paths, timeout: float = 1.0) -> RunningInstance | None:
    """The live instance for this home, if it answers: through `instance.json`, else the discovery file."""
    candidates: list[tuple[str, int]] = []
    info = read_info(paths)
    if info is not None and info.role == SERVICE and info.url:
        candidates.append((info.url, info.pid))
    try:
        doc = json.loads(paths.discovery_file.read_text(encoding="utf-8"))
        candidates.append((str(doc["url"]), int(doc["pid"])))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for url, pid in dict.fromkeys(candidates):
        if pid != os.getpid() and not pid_alive(pid):
            continue
        if answers(url, timeout):
            return RunningInstance(url, pid)
    return None


def service_root(url: str) -> str:
    """The service's root URL (``http://127.0.0.1:7373``) from it or from one of its APIs' roots."""
    url = url.rstrip("/")
    for suffix in (API, "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


class NothingAnswers(Exception):
    """No lmsp-tray answers where it was looked for; `where` is the URL to name to the person."""

    def __init__(self, where: str) -> None:
        super().__init__(f"nothing answers at {where}")
        self.where = where


def find_root(given: str | None, *, default_url: str, timeout: float = 2.0) -> str:
    """The running service's root URL: `given` when it answers; without one, this home's running
    service (`find_running`), else `default_url` when it answers.

    Raises `NothingAnswers`, and `client.loopback.NotLoopback` when `given` is not a loopback URL."""
    if given:
        root = service_root(given)
        check_loopback(root)
        if answers(root + API, timeout):
            return root
        raise NothingAnswers(root)
    try:
        running = find_running(resolve_paths(), timeout=timeout)
    except OSError:
        running = None
    if running is not None:
        return service_root(running.url)
    if answers(default_url + API, timeout):
        return default_url
    raise NothingAnswers(default_url)
