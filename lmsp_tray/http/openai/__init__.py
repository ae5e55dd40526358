"""The OpenAI-compatible `/v1`: what existing apps (SDKs, editor assistants, chat front-ends) speak.

Why a package of its own: `/v1` is one more `Api` beside `/lmsp/v1` — same port,
same engine and scheduler, same bearer tokens, scopes and Host/Origin/size
checks — but with OpenAI's wire shapes and error object. Each endpoint family
lives in its own module and contributes its `Scoped` routes to `OPENAI`:

- `chat.py`: `POST /v1/chat/completions`, `POST /v1/completions` (`responses:create`)
- `models.py`: `GET /v1/models`, `GET /v1/models/{id}` (`models:read`)
- `responses.py`: `POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`,
  `GET /v1/responses/{id}/input_items` (`responses:create` / `responses:read`)
- `embeddings.py`: `POST /v1/embeddings` (`responses:create`)
- `audio.py`: `POST /v1/audio/transcriptions` (`responses:create`), a chat turn with the audio
- `rerank.py`: `POST /v1/rerank`, and `POST /rerank` as llama-server serves it (`OPENAI_ROOT`)
- `errors.py`: OpenAI's `{"error": {"message", "type", "param", "code"}}`
"""

from __future__ import annotations

from lmsp_tray.http.api import Api, PathsApi
from lmsp_tray.http.openai.audio import AUDIO_ROUTES
from lmsp_tray.http.openai.chat import CHAT_ROUTES
from lmsp_tray.http.openai.embeddings import EMBEDDING_ROUTES
from lmsp_tray.http.openai.errors import OPENAI_ERRORS
from lmsp_tray.http.openai.models import MODEL_ROUTES
from lmsp_tray.http.openai.rerank import RERANK_ROUTES, ROOT_RERANK_ROUTES
from lmsp_tray.http.openai.responses import RESPONSE_ROUTES

OPENAI = Api(
    "/v1",
    [*MODEL_ROUTES, *CHAT_ROUTES, *RESPONSE_ROUTES, *EMBEDDING_ROUTES, *RERANK_ROUTES, *AUDIO_ROUTES],
    errors=OPENAI_ERRORS,
)
OPENAI_ROOT = PathsApi("", ROOT_RERANK_ROUTES, errors=OPENAI_ERRORS)
