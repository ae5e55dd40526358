"""Per-model capabilities for `GET /models`, read from the catalog entry without loading the model.

`text` and `streaming` hold for every readable model. `tools` and
`structured_output` come from the engine (grammar-constrained decoding, and
the built-in tool-use instruction for templates that do not take tools), so
every text model has them. `reasoning` needs a model that thinks: a chat
template that knows thinking markers such as `<think>…</think>`.

An embedding model (`GGUFInfo.embeddings`: an encoder such as BERT, or a GGUF
that declares a pooling type) has `embeddings` alone: it does not generate,
so chat and completions to it are refused with `unsupported_capability`. A reranker
(`GGUFInfo.rerank`: `rank` pooling and a classifier head) has `rerank` alone, for `/v1/rerank`.
Chat models are not offered for embeddings (see docs/api-openai.md#embeddings: a generative model's
pooled hidden state is a poor embedding, and serving one would need a second
context per model).

Fill-in-the-middle (`POST /v1/completions` with a `suffix`) is not one of
them: LMSP 1.0 names the capabilities a model object may list, so it is
reported as the extension `extensions.lmsp_tray.fill_in_the_middle` (and in the
`capabilities` of `/v1/models`, which is this service's own field).
"""

from __future__ import annotations

from lmsp_tray.chat.dialects import think_markers
from lmsp_tray.discovery.entry import ModelEntry


def model_capabilities(entry: ModelEntry) -> list[str]:
    if not entry.ok:
        return []
    if entry.info is not None and entry.info.embeddings:
        return ["embeddings"]
    if entry.info is not None and entry.info.rerank:
        return ["rerank"]
    caps = ["text", "streaming", "tools", "structured_output"]
    if think_markers(entry.info.chat_template if entry.info else None):
        caps.append("reasoning")
    return caps


def fill_in_the_middle(entry: ModelEntry) -> bool:
    """Whether the model completes between a prefix and a suffix: a text model whose vocabulary has the
    FIM prefix, suffix and middle tokens (found in its header as llama.cpp finds them)."""
    info = entry.info
    return entry.ok and info is not None and info.fim_tokens and not info.embeddings and not info.rerank
