"""A model download's events (`protocol.downloads`) as Ollama's `/api/pull` progress lines.

Why: Ollama's clients and apps (the `ollama` CLI and clients, Open WebUI's model
manager) follow a pull as NDJSON lines `{"status", "digest", "total", "completed"}`
and end at `{"status": "success"}` or `{"error": …}`. The download itself is the
service's own durable task (`serving.downloads`: resumable, shown in the tray and the
console); this module only re-spells its events. A file is Ollama's "layer": its
`digest` is the file's sha256 on the Hub when the Hub gives one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from lmsp_tray.protocol import downloads as ev
from lmsp_tray.protocol.ollama_stream import error_text

SUCCESS = "success"


def _digest(path: str, sha256: str | None) -> str:
    return "sha256:" + (sha256 or hashlib.sha256(path.encode("utf-8")).hexdigest())


@dataclass
class PullLines:
    """Turns one download task's events into Ollama's pull lines (plain dicts)."""

    digests: dict[str, str] = field(default_factory=dict)  # file path -> digest, from the plan

    def feed(self, name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        if name == ev.CREATED:
            for f in (data.get("download") or {}).get("files") or []:
                self.digests[str(f.get("path"))] = _digest(str(f.get("path")), f.get("sha256"))
            return [{"status": "pulling manifest"}]
        if name == ev.PROGRESS:
            path = str(data.get("file") or "")
            digest = self.digests.get(path) or _digest(path, None)
            return [
                {
                    "status": f"pulling {digest.removeprefix('sha256:')[:12]}",
                    "digest": digest,
                    "total": int(data.get("file_bytes_total") or data.get("bytes_total") or 0),
                    "completed": int(data.get("file_bytes_done") or data.get("bytes_done") or 0),
                }
            ]
        if name == ev.COMPLETED:
            model = (data.get("model") or {}).get("id")
            done = {"status": SUCCESS, **({"model": model} if model else {})}
            return [{"status": "verifying sha256 digest"}, {"status": "writing manifest"}, done]
        if name == ev.FAILED:
            return [{"error": error_text(data.get("error"))}]
        if name == ev.CANCELLED:
            return [{"error": "The download was cancelled; the part fetched is kept, and pulling again resumes it."}]
        if name == ev.PAUSED:
            return [
                {
                    "error": "The download paused because the service stopped; it resumes when the service starts "
                    "again (the tray and the console show it)."
                }
            ]
        return []
