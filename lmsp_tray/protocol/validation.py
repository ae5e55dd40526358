"""The one translation of a pydantic `ValidationError` into the error a client reads.

Why: every request shape — LMSP's responses, OpenAI's chat and text completions,
embeddings — is validated by pydantic at the edge, and a client should read one
wording for one mistake whichever endpoint it called: the first error only,
the field at fault as the path a person would write (`input[0].content[1].text`,
without the union labels and discriminator tags pydantic puts in its locations),
"'x' is required." for a missing field. A content part the service cannot take
is refused by a validator raising `RefusedPart` (each shape words why), and
comes out as `UnsupportedCapability` naming the part.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from lmsp_tray.errors import InvalidRequest, LMSPError, UnsupportedCapability

# Discriminator tags pydantic inserts after a list index (a tagged union's member): the item types of
# LMSP's input, the roles of OpenAI's chat messages, the kinds of content parts.
_TAGS = frozenset(
    {
        *("message", "function_call", "function_call_output", "reasoning"),
        *("system", "developer", "user", "assistant", "tool", "function"),
        *("input_text", "text", "output_text", "refusal"),
    }
)
# Labels pydantic inserts for the member of a plain union that failed (besides `list[...]`, `function-...`).
_UNION_LABELS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "NamedToolChoice", "NamedChoice"})
_FIELD_NAMES = {"schema_": "schema"}  # attributes named apart from their JSON field
M = TypeVar("M", bound=BaseModel)


class RefusedPart(ValueError):
    """Raised by a validator for content part `index` of a kind this service cannot take; `detail` says why."""

    def __init__(self, detail: str, index: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.index = index


def validated(edge_model: type[M], body: Any) -> M:
    """A decoded body validated as `edge_model`, or a 400 naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return edge_model.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None


def request_error(exc: ValidationError, prefix: tuple[Any, ...] = (), offset: int = 0) -> LMSPError:
    """The first pydantic error as a 400 naming the field; `prefix` is where the validated value sits in the
    body (`extensions.lmsp_tray`), `offset` is added to the first index (a batch of a long list, validated apart)."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err.get("loc") or ())
    if offset and loc and isinstance(loc[0], int):
        loc = (loc[0] + offset, *loc[1:])
    param = field_path(prefix + loc)
    ctx = err.get("ctx") or {}
    refused = ctx.get("error")
    if isinstance(refused, RefusedPart):
        return UnsupportedCapability(refused.detail, param=f"{param}[{refused.index}]" if param else None)
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "missing":
        detail = f"'{param}' is required."
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        detail = f"'{param}' has an unknown or missing {ctx.get('discriminator', 'tag')}: {msg}."
    else:
        detail = f"'{param}': {msg}." if param else f"{msg}."
    return InvalidRequest(detail, param=param or None)


def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic location as a field path: `("input", 0, "message", "content")` is `input[0].content`."""
    out = ""
    after_index = False
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
            after_index = True
            continue
        seg = str(seg)
        if after_index and seg in _TAGS:  # the discriminator tag pydantic inserts after a list index
            after_index = False
            continue
        if seg in _UNION_LABELS or "[" in seg or seg.startswith("function-"):
            continue  # the union member pydantic tried
        out += ("." if out else "") + _FIELD_NAMES.get(seg, seg)
        after_index = False
    return out
