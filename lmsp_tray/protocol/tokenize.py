"""Validation of the tokenizer endpoints' bodies (`/lmsp/v1/models/{id}/tokenize`, `/detokenize`,
`/apply-template`): the fields llama-server's `/tokenize`, `/detokenize` and `/apply-template` take.

Why: apps count tokens before they send (to fit a window, to bill, to cut a
document into chunks) and check what prompt a model really sees; llama-server
answers these, so its field names are kept: `content`, `add_special`,
`parse_special`, `with_pieces`; `tokens`; `messages`. Unknown fields are
ignored; every rejection is an `InvalidRequest` naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lmsp_tray.protocol.validation import validated

MAX_TOKENS = 1 << 20  # a detokenize body of at most this many tokens


class TokenizeCreate(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    content: str
    add_special: bool = False  # the model's start (and end) tokens, as a prompt gets them
    parse_special: bool = True  # special-token text such as <|im_start|> becomes that token
    with_pieces: bool = False  # each token as {"id", "piece"}


class DetokenizeCreate(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    tokens: list[int] = Field(max_length=MAX_TOKENS)


class TemplateMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: str = Field(min_length=1)
    content: str | list[Any] | None = None


class ApplyTemplateCreate(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    messages: list[TemplateMessage] = Field(min_length=1)
    add_generation_prompt: bool = True


def parse_tokenize(body: Any) -> TokenizeCreate:
    return validated(TokenizeCreate, body)


def parse_detokenize(body: Any) -> DetokenizeCreate:
    return validated(DetokenizeCreate, body)


def parse_apply_template(body: Any) -> ApplyTemplateCreate:
    return validated(ApplyTemplateCreate, body)
