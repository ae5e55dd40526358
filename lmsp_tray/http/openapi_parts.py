"""The JSON Schema building blocks the OpenAPI modules share.

Used by `openapi`, `openapi_schemas`, `openapi_downloads` and `openapi_console`.

Why a module: the document is assembled from several modules, and each needs the same
references, nullable and object shapes; one definition keeps them identical.
"""

from __future__ import annotations

from typing import Any

REF = "#/components/schemas/"
NULL = {"type": "null"}
STR, INT, BOOL, NUM = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, NULL]}


def obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}
