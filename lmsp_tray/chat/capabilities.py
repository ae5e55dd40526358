"""Per-model capabilities for `GET /models`, read from the catalog entry without loading the model.

`text` and `streaming` hold for every readable model. `tools` and
`structured_output` come from the engine (grammar-constrained decoding, and
the built-in tool-use instruction for templates that do not take tools), so
every text model has them. `reasoning` needs a model that thinks: a chat
template that knows thinking markers such as `<think>…</think>`.
"""

from __future__ import annotations

from lmsp_tray.chat.dialects import think_markers
from lmsp_tray.discovery.entry import ModelEntry


def model_capabilities(entry: ModelEntry) -> list[str]:
    if not entry.ok:
        return []
    caps = ["text", "streaming", "tools", "structured_output"]
    if think_markers(entry.info.chat_template if entry.info else None):
        caps.append("reasoning")
    return caps
