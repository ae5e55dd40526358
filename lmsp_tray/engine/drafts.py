"""Which draft model a model loads with, decided in the service from the files' headers.

A model's ``draft = "<id>"`` setting names a small model of the same vocabulary that drafts tokens for
it in its model process (`runner.draft_model`). Before the load, the service finds that id among the
models it knows and checks what the headers tell: the file is a usable text-generation model, not the
model itself, with as many tokens and the same start and end tokens. A draft that fails is refused
(`DraftRefused`, its reason): the model loads without it and says why (`LoadPlan.draft_skipped`, the
listing, the log). The model process checks the token texts themselves once both are loaded.
"""

from __future__ import annotations

from lmsp_tray.discovery.entry import ModelEntry


class DraftRefused(Exception):
    """The named draft model cannot draft for this model; `reason` says why, in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_draft(main: ModelEntry, draft_id: str, draft: ModelEntry | None) -> ModelEntry:
    """`draft` (found for `draft_id`) when it can draft for `main`; else `DraftRefused`."""
    named = f"the draft model '{draft_id}'"
    if draft is None:
        raise DraftRefused(f"{named} was not found among the models this service knows")
    if draft.id == main.id or draft.path == main.path:
        raise DraftRefused(f"{named} is the model itself")
    if not draft.ok or draft.info is None:
        raise DraftRefused(f"{named} cannot be used: {draft.error or 'its header could not be read'}")
    info, own = draft.info, main.info
    if info.kind != "model" or info.embeddings or info.rerank:
        raise DraftRefused(f"{named} is not a text-generation model")
    if own is not None and own.vocab_size and info.vocab_size and own.vocab_size != info.vocab_size:
        raise DraftRefused(
            f"{named} has another vocabulary ({info.vocab_size:,} tokens, the model {own.vocab_size:,}); "
            f"a draft model must share the model's tokenizer"
        )
    if own is not None and (own.bos_token, own.eos_token) != (info.bos_token, info.eos_token):
        raise DraftRefused(
            f"{named} has another vocabulary (start and end tokens {info.bos_token!r} and {info.eos_token!r}, "
            f"the model's {own.bos_token!r} and {own.eos_token!r})"
        )
    if draft.size_bytes >= main.size_bytes:
        raise DraftRefused(f"{named} is not smaller than the model ({draft.size_bytes:,} bytes): it would not pay")
    return draft
