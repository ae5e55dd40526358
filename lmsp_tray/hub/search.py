"""Finding GGUF models on the Hugging Face Hub for the console's Discover view, cached briefly.

Why apart from pulling: a search is many repositories at once, each with the figures a person
chooses by (downloads, likes, last update); the variants of one repository, their sizes and how
each would fit this machine come from `Puller.list_variants` (the fit rules `pull` uses) when the
person opens it. Nothing is asked of the Hub until a person searches; an answer is kept
`CACHE_SECONDS` so typing, paging back and reopening do not ask again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from lmsp_tray.hub.pull import Puller

CACHE_SECONDS = 300.0
MAX_RESULTS = 30
MAX_CACHED = 64


def _when(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else (str(value) if value else None)


class HubSearch:
    """Searches and variant listings through `puller`'s Hub client, each answer cached for a while."""

    def __init__(self, puller: Puller, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.puller = puller
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def _cached(self, key: tuple[str, str], make: Callable[[], Any]) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < CACHE_SECONDS:
                return hit[1]
        value = make()
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if now - v[0] < CACHE_SECONDS}
            if len(self._cache) >= MAX_CACHED:
                self._cache.pop(min(self._cache, key=lambda k: self._cache[k][0]))
            self._cache[key] = (now, value)
        return value

    def search(self, text: str, limit: int = MAX_RESULTS) -> list[dict[str, Any]]:
        """GGUF repositories matching `text`, most downloaded first. Blocking (network)."""
        text = text.strip()

        def ask() -> list[dict[str, Any]]:
            found = self.puller.client.search(text, limit=min(limit, MAX_RESULTS))
            return [
                {
                    "repository": m.id,
                    "downloads": getattr(m, "downloads", None),
                    "likes": getattr(m, "likes", None),
                    "updated_at": _when(getattr(m, "last_modified", None) or getattr(m, "created_at", None)),
                    "model": f"hf.co/{m.id}",
                }
                for m in found
            ]

        return list(self._cached(("search", f"{limit}:{text.lower()}"), ask))

    def variants(self, repo_id: str) -> dict[str, Any]:
        """One repository's GGUF variants: size, whether each fits this machine, the vision projector."""

        def ask() -> dict[str, Any]:
            listed = self.puller.list_variants(repo_id)
            default = listed.default.variant.label if listed.default else None
            return {
                "repository": repo_id,
                "projector": listed.projector,
                "default": default,
                "variants": [
                    {
                        "label": v.label,
                        "quantization": v.quant,
                        "size_bytes": v.size,
                        "files": [f.path for f in v.files],
                        "runnable": not v.missing_parts,
                        "model": f"hf.co/{repo_id}:{v.label}",
                        "fit": listed.fits[v.label].to_json() if v.label in listed.fits else None,
                    }
                    for v in listed.variants
                ],
            }

        return dict(self._cached(("variants", repo_id), ask))
