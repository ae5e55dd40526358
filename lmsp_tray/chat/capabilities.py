"""Per-model capabilities for `GET /models`, read from the catalog entry without loading the model.

`text` and `streaming` hold for every readable model. `tools` and
`structured_output` come from the engine (grammar-constrained decoding, and
the built-in tool-use instruction for templates that do not take tools), so
every text model has them. `reasoning` needs a model that thinks: a chat
template that knows thinking markers such as `<think>…</think>`.

An embedding model (`GGUFInfo.embeddings`: an encoder such as BERT, or a GGUF
that declares a pooling type) has `embeddings` alone: it does not generate,
so chat and completions to it are refused with `unsupported_capability`.
Chat models are not offered for embeddings (see README: a generative model's
pooled hidden state is a poor embedding, and serving one would need a second
context per model).
"""

from __future__ import annotations

from lmsp_tray.chat.dialects import think_markers
from lmsp_tray.discovery.entry import ModelEntry


def model_capabilities(entry: ModelEntry) -> list[str]:
    if not entry.ok:
        return []
    if entry.info is not None and entry.info.embeddings:
        return ["embeddings"]
    caps = ["text", "streaming", "tools", "structured_output"]
    if think_markers(entry.info.chat_template if entry.info else None):
        caps.append("reasoning")
    return caps
