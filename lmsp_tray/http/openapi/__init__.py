"""The OpenAPI 3.1 document of the service's API, one module per surface on a shared builder kit.

Why hand-written (request bodies taken from the pydantic models that validate them): the API has
shapes a generator cannot see — SSE event streams, problem documents from middleware, endpoints
that need no token. The layout, bottom up: `parts` (schema shapes, answers, the operation
skeleton; imports no sibling), `schemas` (LMSP's shapes and response events), one module per
surface — `lmsp` (/lmsp/v1), `downloads` (model pulls), `console` (the console's endpoints),
`openai` (the OpenAI-compatible /v1) — and `document`, which puts them together.
"""

from lmsp_tray.http.openapi.document import build_openapi
from lmsp_tray.http.openapi.schemas import EVENTS

__all__ = ["EVENTS", "build_openapi"]
