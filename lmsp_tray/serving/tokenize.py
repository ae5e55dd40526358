"""The model's tokenizer and chat template, without generating: what the tokenizer endpoints ask.

Why apart from `service`: these are one question and one answer about a model
(no run, no events, no store). The model is loaded on demand, as for a
response; tokenizing and detokenizing are done by its own process (its
vocabulary lives there), and the chat template is rendered exactly as a
response's prompt is, so `/apply-template` shows what the model will read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lmsp_tray.engine.loaded import LoadedModel
from lmsp_tray.protocol.tokenize import ApplyTemplateCreate, DetokenizeCreate, TokenizeCreate
from lmsp_tray.serving.on_model import ask_model
from lmsp_tray.serving.service import Service

T = TypeVar("T")


async def _with_model(service: Service, model_id: str, work: Callable[[LoadedModel], T]) -> tuple[str, T]:
    entry = service.entry(model_id)
    return entry.id, await ask_model(service, entry, work)


async def tokenize(service: Service, model_id: str, request: TokenizeCreate) -> dict[str, Any]:
    """`{"model", "tokens"}`: the text's tokens (or `{"id", "piece"}` each, with `with_pieces`)."""
    model, tokens = await _with_model(
        service,
        model_id,
        lambda m: m.tokenize(
            request.content,
            add_special=request.add_special,
            parse_special=request.parse_special,
            with_pieces=request.with_pieces,
        ),
    )
    return {"object": "tokens", "model": model, "tokens": tokens, "count": len(tokens)}


async def detokenize(service: Service, model_id: str, request: DetokenizeCreate) -> dict[str, Any]:
    """`{"model", "content"}`: the tokens' text, special tokens written out."""
    model, text = await _with_model(service, model_id, lambda m: m.detokenize(request.tokens))
    return {"object": "text", "model": model, "content": text}


async def apply_template(service: Service, model_id: str, request: ApplyTemplateCreate) -> dict[str, Any]:
    """`{"model", "prompt"}`: the messages through the model's chat template, as a response renders them."""
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    model, prompt = await _with_model(
        service, model_id, lambda m: m.render(messages, add_generation_prompt=request.add_generation_prompt)
    )
    return {"object": "prompt", "model": model, "prompt": prompt}
