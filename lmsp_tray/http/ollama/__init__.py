"""The Ollama-compatible API: `GET /` and `/api/…`, what most local-model apps speak.

Why a package of its own: Ollama's API is one more `Api` beside `/lmsp/v1` and `/v1`
— the same port (and, opted in, a second loopback listener on Ollama's own port,
`ollama_port`), the same engine and scheduler, the same bearer tokens, scopes,
`keyless_scopes` and Host/Origin/size checks — with Ollama's wire shapes and its
`{"error": "…"}`. Its paths are not under one prefix (`/` is the probe apps send, the
rest under `/api/`), so `OllamaApi` owns exactly those. Each endpoint family lives in
its own module and contributes its `Scoped` routes:

- `models.py`: `GET /`, `GET /api/version` (public), `GET /api/tags`, `POST /api/show`,
  `GET /api/ps` (`models:read`)
- `generate.py`: `POST /api/chat`, `POST /api/generate` (`responses:create`)
- `embed.py`: `POST /api/embed`, `POST /api/embeddings` (`responses:create`)
- `manage.py`: `POST /api/pull`; `DELETE /api/delete`, `/api/create`, `/api/copy`,
  `/api/push` refused (`models:manage`)
- `errors.py`: Ollama's error object (a 401 names `keyless_scopes`)
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from lmsp_tray.http.api import Api
from lmsp_tray.http.ollama.embed import ROUTES as EMBED_ROUTES
from lmsp_tray.http.ollama.errors import OLLAMA_ERRORS
from lmsp_tray.http.ollama.generate import ROUTES as GENERATE_ROUTES
from lmsp_tray.http.ollama.manage import ROUTES as MANAGE_ROUTES
from lmsp_tray.http.ollama.models import ROUTES as MODEL_ROUTES

API_PREFIX = "/api"


class OllamaApi(Api):
    """An `Api` whose routes carry their full paths: it owns `/` and everything under `/api/`."""

    def owns(self, path: str) -> bool:
        return path == "/" or path == API_PREFIX or path.startswith(API_PREFIX + "/")

    def starlette_routes(self) -> list[BaseRoute]:
        return list(self.routes)


OLLAMA = OllamaApi("", [*MODEL_ROUTES, *GENERATE_ROUTES, *EMBED_ROUTES, *MANAGE_ROUTES], errors=OLLAMA_ERRORS)
