"""Validation of `POST /v1/rerank` bodies: the Jina/Cohere shape llama-server also serves.

Why apart from `embeddings`: a rerank request is one query and the documents
to score against it, answered with the documents' indices sorted by
relevance, not vectors. `documents` are strings or `{"text": ...}` objects
(Cohere's and Jina's clients send either); `top_n` keeps the best n;
`return_documents` echoes each document's text in its result. Unknown fields
are ignored, as in the other OpenAI-compatible bodies. Every rejection is an
`InvalidRequest` naming the field at fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.validation import validated

MAX_DOCUMENTS = 2048  # as many inputs as /v1/embeddings takes


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str


class RerankCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False


@dataclass(frozen=True)
class RerankRequest:
    model: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None
    return_documents: bool = False


def parse_rerank_create(body: Any) -> RerankRequest:
    """Validate a decoded JSON body into a `RerankRequest`, or raise `InvalidRequest`."""
    edge = validated(RerankCreate, body)
    documents = tuple(d if isinstance(d, str) else d.text for d in edge.documents)
    empty = next((i for i, d in enumerate(documents) if not d), None)
    if empty is not None:
        raise InvalidRequest(f"'documents[{empty}]' is empty.", param=f"documents[{empty}]")
    return RerankRequest(edge.model, edge.query, documents, edge.top_n, edge.return_documents)
