"""Validation of `POST /v1/embeddings` bodies (OpenAI's shape): pydantic at the edge, a dataclass inside.

`input` is what OpenAI accepts: a string, a list of strings, a list of token
ids, or a list of token-id lists; at most `MAX_INPUTS` of them, none empty.
`encoding_format` is `float` or `base64` (little-endian float32, what the
SDKs decode with numpy), `dimensions` truncates each vector (then normalised
again). Unknown fields (`user`, …) are ignored, as OpenAI-compatible servers
do. Every rejection is an `InvalidRequest` naming the field at fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.validation import validated

MAX_INPUTS = 2048  # as OpenAI


class EmbeddingCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    encoding_format: str = "float"
    dimensions: int | None = None


def _tokens(value: list[Any], param: str) -> tuple[int, ...]:
    if not value:
        raise InvalidRequest(f"'{param}' is empty.", param=param)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise InvalidRequest(f"'{param}' must hold token ids (integers) only.", param=param)
    return tuple(value)


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("'input' is an empty string.", param="input")
        return (value,)
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'input' must be a string, a list of strings, a list of token ids or a list of token-id lists, "
            "and not empty.",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'input' holds {len(value)} items; at most {MAX_INPUTS} per request.", param="input")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return (_tokens(value, "input"),)
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"'input[{i}]' is an empty string.", param=f"input[{i}]")
            out.append(item)
        elif isinstance(item, list):
            out.append(_tokens(item, f"input[{i}]"))
        else:
            raise InvalidRequest(f"'input[{i}]' must be a string or a list of token ids.", param=f"input[{i}]")
    return tuple(out)


def parse_embedding_create(body: Any) -> EmbeddingRequest:
    """Validate a decoded JSON body into an `EmbeddingRequest`, or raise `InvalidRequest`."""
    if isinstance(body, dict) and "input" not in body:
        raise InvalidRequest("'input' is required.", param="input")
    edge = validated(EmbeddingCreate, body)
    return EmbeddingRequest(edge.model, _inputs(edge.input), edge.encoding_format, edge.dimensions)
