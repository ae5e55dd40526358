"""How an OpenAI completions request samples: its fields and `extensions.lmsp_tray`, as `ResponseRequest`'s.

Why: `/v1/chat/completions` and `/v1/completions` take the same sampling fields
(`temperature`, `top_p`, `stop`, `seed`, the two penalties) and the same
extension options as `/lmsp/v1` (`top_k`, `min_p`, `repeat_penalty`,
`keep_alive`, …); one mapping keeps the two from drifting apart. An
extension option wins over the request's own field (`top_p`, `seed`), except
`stop`, where the request's own strings win.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import ValidationError

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.requests import LmspTrayOptions
from lmsp_tray.protocol.validation import request_error

SEED_RANGE = 2**32 - 1  # llama.cpp's seeds: 0 .. 2**32 - 2 (the last value means "random")


class SamplingFields(Protocol):
    """The fields of a validated chat or text completion request that decide how it samples."""

    temperature: float | None
    top_p: float | None
    stop: str | list[str] | None
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    extensions: dict[str, Any] | None


def lmsp_options(extensions: dict[str, Any] | None) -> dict[str, Any]:
    """`extensions.lmsp_tray`, validated as on `/lmsp/v1`: the options it sets (none set: empty)."""
    ext = (extensions or {}).get("lmsp_tray") if isinstance(extensions, dict) else None
    if ext is None:
        return {}
    if not isinstance(ext, dict):
        raise InvalidRequest("extensions.lmsp_tray must be an object.", param="extensions.lmsp_tray")
    try:
        opts = LmspTrayOptions.model_validate(ext)
    except ValidationError as exc:
        raise request_error(exc, prefix=("extensions", "lmsp_tray")) from None
    return opts.model_dump(exclude_none=True)


def sampling(edge: SamplingFields, opts: dict[str, Any]) -> dict[str, Any]:
    """`ResponseRequest`'s sampling and keep-alive fields for `edge` and its `lmsp_options`."""
    stops = [edge.stop] if isinstance(edge.stop, str) else list(edge.stop or [])
    seed = opts.get("seed")
    if seed is None and edge.seed is not None:
        seed = edge.seed % SEED_RANGE  # OpenAI takes any integer; llama.cpp a 32-bit one
    return {
        "temperature": edge.temperature,
        "top_p": opts.get("top_p", edge.top_p),
        "top_k": opts.get("top_k"),
        "min_p": opts.get("min_p"),
        "seed": seed,
        "stop": stops or list(opts.get("stop") or []),
        "repeat_penalty": opts.get("repeat_penalty"),
        "presence_penalty": edge.presence_penalty or 0.0,
        "frequency_penalty": edge.frequency_penalty or 0.0,
        "keep_alive": opts.get("keep_alive"),
    }
