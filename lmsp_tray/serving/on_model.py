"""One question to a model that answers at once (no run, no events): the model loaded on demand, the
question asked off the event loop, and asked again once if the model was unloaded or crashed meanwhile.

Why: embeddings, reranking and the tokenizer endpoints all ask a model this way; one place says how
a model that went away under a question is treated (loaded again and asked once more, unless the
asker left: `cancel`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.embedding import EmbedCancel
from lmsp_tray.engine.loaded import LoadedModel
from lmsp_tray.errors import ModelCrashed, ServiceUnavailable
from lmsp_tray.serving.service import Service

T = TypeVar("T")


async def ask_model(
    service: Service, entry: ModelEntry, question: Callable[[LoadedModel], T], *, cancel: EmbedCancel | None = None
) -> T:
    """`question(model)` on a worker thread, the model loaded first if it is not; after
    `cancel.cancel()` no new attempt starts (`RequestCancelled`)."""
    for attempt in range(2):
        model = service.models.use_if_loaded(entry.id)
        if model is None:
            model = await asyncio.to_thread(service.models.acquire, entry)
        if cancel is not None:
            cancel.check()  # gone while the model loaded
        try:
            return await asyncio.to_thread(question, model)
        except (ServiceUnavailable, ModelCrashed):
            if attempt or (cancel is not None and cancel.cancelled):
                raise  # unloaded (or gone) twice in a row, or no one waits for it: give up
    raise AssertionError("unreachable")
