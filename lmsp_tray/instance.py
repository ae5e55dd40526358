"""The running instance, as other processes see it: the discovery file and its health check.

The daemon writes `service.json` (mode 0600) in the per-user runtime folder once its socket is
bound and removes it on a clean exit; a second start, the token CLI and apps read it to find the
service. Kept apart from `daemon` so that finding an instance imports neither uvicorn nor llama.cpp.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from dataclasses import dataclass

from lmsp_tray import __version__
from lmsp_tray.config import Paths


@dataclass(frozen=True)
class RunningInstance:
    url: str
    pid: int


def find_running(paths: Paths, timeout: float = 1.0) -> RunningInstance | None:
    """The live instance named by the discovery file, if its pid lives and it answers."""
    try:
        info = json.loads(paths.discovery_file.read_text(encoding="utf-8"))
        url, pid = str(info["url"]), int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        with opener.open(url, timeout=timeout) as reply:  # loopback URL we wrote
            doc = json.loads(reply.read())
        if doc.get("object") == "service":
            return RunningInstance(url, pid)
    except (OSError, ValueError):
        return None
    return None


def write_discovery_file(paths: Paths, url: str, owner_token_id: str | None) -> None:
    """Atomically write `service.json` for this process (0600, folder 0700)."""
    path = paths.discovery_file
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc: dict[str, object] = {"url": url, "pid": os.getpid(), "version": __version__, "started_at": int(time.time())}
    if owner_token_id:
        doc["owner_token_id"] = owner_token_id
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def remove_discovery_file(paths: Paths) -> None:
    """Remove `service.json` if this process wrote it (never another instance's)."""
    path = paths.discovery_file
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
            path.unlink()
