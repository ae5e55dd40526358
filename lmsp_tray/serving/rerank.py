"""Reranking for `/v1/rerank`: the reranker checked, loaded on demand, and asked for its scores.

Why apart from `embeddings`: the question and the answer differ (a query and
documents in; the documents' indices by relevance out), though the work is
the same — the reranker runs in an embedding model process, each (query,
document) pair one input of its batches, and a request whose client went
away is stopped through its `EmbedCancel`. The model must have the `rerank`
capability (`rank` pooling); any other is refused with
`unsupported_capability`. The scores are the classifier's raw logits, as
llama-server `--reranking` reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmsp_tray.engine.embedding import EmbedCancel
from lmsp_tray.errors import UnsupportedCapability
from lmsp_tray.protocol.rerank import RerankRequest
from lmsp_tray.serving.on_model import ask_model
from lmsp_tray.serving.service import Service


@dataclass(frozen=True)
class Ranked:
    """Each document's score (in the request's order) and the tokens each pair took."""

    model: str
    scores: tuple[float, ...]
    token_counts: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)


async def rerank(service: Service, request: RerankRequest, *, cancel: EmbedCancel | None = None) -> Ranked:
    """The scores of `request.documents` against `request.query`; after `cancel.cancel()` it stops
    within one decode and raises `RequestCancelled`."""
    entry = service.entry(request.model, param="model")
    if "rerank" not in service.model_capabilities(entry):
        raise UnsupportedCapability(
            f"'{entry.id}' is not a reranker; reranking needs a model made for it (bge-reranker, "
            f"jina-reranker, Qwen3-Reranker, ...: the 'rerank' capability). GET /v1/models lists each "
            f"model's capabilities.",
            param="model",
        )
    pairs = [(request.query, document) for document in request.documents]
    result = await ask_model(service, entry, lambda m: m.rerank(pairs, cancel=cancel), cancel=cancel)
    return Ranked(entry.id, tuple(float(row[0]) for row in result.vectors), result.token_counts)


def rerank_answer(request: RerankRequest, ranked: Ranked) -> dict[str, object]:
    """The Jina/Cohere answer: `results` by relevance, highest first (`top_n` of them), and `usage`."""
    order = sorted(range(len(ranked.scores)), key=lambda i: ranked.scores[i], reverse=True)
    if request.top_n is not None:
        order = order[: request.top_n]
    results: list[dict[str, object]] = []
    for i in order:
        item: dict[str, object] = {"index": i, "relevance_score": ranked.scores[i]}
        if request.return_documents:
            item["document"] = {"text": request.documents[i]}
        results.append(item)
    usage = {"prompt_tokens": ranked.prompt_tokens, "total_tokens": ranked.prompt_tokens}
    return {"object": "list", "model": ranked.model, "results": results, "usage": usage}
