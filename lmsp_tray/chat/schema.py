"""JSON Schema to GBNF, refusing what it cannot enforce.

Structured output and tool arguments must *validate* against the client's
schema, so every keyword is either enforced by the grammar, harmless (an
annotation), or refused with a `SchemaError` naming the keyword and where it
sits. Enforced: `type` (also lists), `properties`, `required`,
`additionalProperties`, `items`, `prefixItems`, `minItems`, `maxItems`,
`enum`, `const`, `pattern` (the common regex subset: `chat.regex`), `anyOf`, `oneOf` (when its branches provably exclude each
other), single-branch `allOf`, local `$ref` with `$defs`/`definitions`
(recursion included), `minimum`/`maximum`/`exclusive*` (whole-number bounds
for `number`), `minLength`/`maxLength`, and the formats in `gbnf.FORMATS`.
The grammar produces a subset of what the schema allows (no extra properties,
no exponents on bounded numbers), never more.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lmsp_tray.chat import regex
from lmsp_tray.chat.gbnf import FORMATS, Grammar, format_rule, integer_range, literal, literal_trie, number_range

Path = tuple[str | int, ...]

ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "nullable",
        "discriminator",
        "propertyOrdering",
        "contentEncoding",
        "contentMediaType",
        "$defs",
        "definitions",
        "strict",
    }
)
KEYWORDS_BY_TYPE = {
    "object": frozenset({"properties", "required", "additionalProperties", "minProperties", "maxProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}),
    "string": frozenset({"minLength", "maxLength", "format", "pattern"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
}
GENERAL = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"})
TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
NOT_ENFORCEABLE = {
    "not": "'not' cannot be enforced while generating",
    "if": "conditional schemas (if/then/else) cannot be enforced while generating",
    "then": "conditional schemas (if/then/else) cannot be enforced while generating",
    "else": "conditional schemas (if/then/else) cannot be enforced while generating",
    "patternProperties": "patternProperties cannot be enforced",
    "propertyNames": "propertyNames cannot be enforced",
    "dependentRequired": "dependentRequired cannot be enforced",
    "dependentSchemas": "dependentSchemas cannot be enforced",
    "dependencies": "dependencies cannot be enforced",
    "unevaluatedProperties": "unevaluatedProperties cannot be enforced",
    "unevaluatedItems": "unevaluatedItems cannot be enforced",
    "contains": "contains cannot be enforced",
    "minContains": "minContains cannot be enforced",
    "maxContains": "maxContains cannot be enforced",
    "additionalItems": "additionalItems cannot be enforced; use prefixItems and items",
    "multipleOf": "multipleOf cannot be enforced",
    "$dynamicRef": "$dynamicRef cannot be enforced",
    "$recursiveRef": "$recursiveRef cannot be enforced; use $ref",
}
MAX_RULES = 4000
TRIE_FROM_VALUES = 16  # enums longer than this compile to a prefix tree of their values
BIG = 10**15  # bounds beyond this are treated as no bound (generated numbers stay far below)


def _any_key(schema: Any) -> bool:
    """Whether a `propertyNames` schema holds for every key: true, {} or {"type": "string"} (annotated)."""
    if schema is True:
        return True
    return isinstance(schema, dict) and all(
        k in ANNOTATIONS or (k == "type" and v == "string") for k, v in schema.items()
    )


class SchemaError(ValueError):
    """A schema feature that cannot be enforced, and where it is (`path`, keyword last)."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def path_text(path: Path) -> str:
    out = ""
    for seg in path:
        out += f"[{seg}]" if isinstance(seg, int) else (("." if out else "") + str(seg))
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_matches(value: Any, types: set[str]) -> bool:
    kind = _json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


class SchemaCompiler:
    """Compiles one root schema (and what its `$ref`s point to) into rules of a `Grammar`."""

    def __init__(self, grammar: Grammar, root: Any, *, name: str = "root") -> None:
        self.grammar = grammar
        self.root = root
        self.name = name
        self._refs: dict[str, str] = {}

    # -- entry point ----------------------------------------------------------------------------
    def compile(self) -> str:
        """The name of the rule matching the root schema's JSON (with trailing `space`)."""
        return self.visit(self.root, (), self.name)

    def visit(self, schema: Any, path: Path, name: str) -> str:
        if len(self.grammar.rules) > MAX_RULES:
            raise SchemaError(path, f"the schema is too large to enforce (over {MAX_RULES:,} grammar rules)")
        if schema is True or schema == {}:
            return self.grammar.primitive("value")
        if schema is False:
            raise SchemaError(path, "the schema 'false' can never be satisfied")
        if not isinstance(schema, dict):
            raise SchemaError(path, "a schema must be an object or a boolean")
        self._check_keywords(schema, path)
        if "$ref" in schema:
            self._only(schema, path, "$ref", allowed=set())
            return self._ref(schema["$ref"], path + ("$ref",))
        if "allOf" in schema:
            branches = schema["allOf"]
            if not isinstance(branches, list) or len(branches) != 1:
                raise SchemaError(path + ("allOf",), "allOf with more than one schema cannot be enforced")
            self._only(schema, path, "allOf", allowed=set())
            return self.visit(branches[0], path + ("allOf", 0), name)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._union(schema, key, path, name)
        if "const" in schema or "enum" in schema:
            return self._enum(schema, path, name)
        types = self._types(schema, path)
        if len(types) == 1:
            return self._typed(schema, types[0], path, name)
        alts = [self._typed(schema, t, path, f"{name}-{t}") for t in types]
        return self.grammar.add(name, " | ".join(alts))

    # -- keyword checks -------------------------------------------------------------------------
    def _check_keywords(self, schema: dict[str, Any], path: Path) -> None:
        for key, value in schema.items():
            if key in NOT_ENFORCEABLE:
                if key == "multipleOf" and value == 1 and schema.get("type") == "integer":
                    continue
                if key == "propertyNames" and _any_key(value):
                    continue  # every JSON object key is a string: it holds (zod writes it for records)
                raise SchemaError(path + (key,), NOT_ENFORCEABLE[key])
            if key in GENERAL or key in ANNOTATIONS or key.startswith("x-"):
                continue
            if any(key in words for words in KEYWORDS_BY_TYPE.values()):
                continue
            raise SchemaError(path + (key,), f"unknown keyword '{key}' cannot be enforced")

    @staticmethod
    def _only(schema: dict[str, Any], path: Path, key: str, allowed: set[str]) -> None:
        """`key` must not be combined with constraining siblings (annotations are fine)."""
        for other in schema:
            if other != key and other not in ANNOTATIONS and other not in allowed and not other.startswith("x-"):
                raise SchemaError(
                    path + (other,), f"'{other}' next to '{key}' cannot be enforced; move it into the '{key}' branches"
                )

    def _types(self, schema: dict[str, Any], path: Path) -> list[str]:
        declared = schema.get("type")
        if declared is None:
            families = [t for t, words in KEYWORDS_BY_TYPE.items() if words & schema.keys()]
            if len(families) > 1:
                raise SchemaError(path, f"keywords for several types ({', '.join(families)}) without 'type'")
            return families or ["any"]
        names = declared if isinstance(declared, list) else [declared]
        if not names or any(t not in TYPES for t in names):
            raise SchemaError(path + ("type",), f"'type' must be one of {', '.join(TYPES)} or a list of them")
        if "number" in names and "integer" in names:
            names = [t for t in names if t != "integer"]
        return list(dict.fromkeys(names))

    # -- $ref, unions, enums --------------------------------------------------------------------
    def _resolve(self, ref: Any, path: Path) -> tuple[Any, Path]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(path, "only local references ('#/$defs/...') can be followed")
        target: Any = self.root
        where: Path = ()
        for raw in [p for p in ref[1:].split("/") if p]:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
                where += (part,)
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
                where += (int(part),)
            else:
                raise SchemaError(path, f"reference '{ref}' points to nothing")
        return target, where

    def _ref(self, ref: Any, path: Path) -> str:
        target, where = self._resolve(ref, path)
        if isinstance(ref, str) and ref in self._refs:
            return self._refs[ref]
        key = self.grammar.reserve(f"{self.name}-ref-{'-'.join(str(p) for p in where) or 'root'}")
        self._refs[ref] = key
        body = self.visit(target, where, key + "-body")
        self.grammar.define(key, body)
        return key

    def _union(self, schema: dict[str, Any], key: str, path: Path, name: str) -> str:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(path + (key,), f"'{key}' must be a non-empty list of schemas")
        self._only(schema, path, key, allowed={"type"})
        if "type" in schema:  # a sibling 'type' narrows every branch
            allowed = set(self._types(schema, path)) | ({"integer"} if "number" in schema["type"] else set())
            branches = [self._narrow(b, allowed, path + (key, i)) for i, b in enumerate(branches)]
        if key == "oneOf" and not self._disjoint(branches, path + (key,)):
            raise SchemaError(
                path + (key,),
                "oneOf branches that may overlap cannot be enforced; use anyOf, or give "
                "each branch a different type or a distinguishing const property",
            )
        alts = [self.visit(b, path + (key, i), f"{name}-{i}") for i, b in enumerate(branches)]
        return self.grammar.add(name, " | ".join(alts))

    def _narrow(self, branch: Any, allowed: set[str], path: Path) -> Any:
        """`branch` limited to the types in `allowed` (from a 'type' next to anyOf/oneOf)."""
        if branch is True or branch == {}:
            return {"type": sorted(allowed)}
        target = self._effective(branch, path)
        if (
            isinstance(target, dict)
            and "type" not in target
            and "$ref" not in branch
            and not (
                "anyOf" in target or "oneOf" in target or "allOf" in target or "const" in target or "enum" in target
            )
        ):
            return {**target, "type": sorted(allowed)}
        if isinstance(target, dict) and "type" in target:
            own = target["type"] if isinstance(target["type"], list) else [target["type"]]
            if set(own) <= allowed:
                return branch
        raise SchemaError(path, "this branch must declare a 'type' within the 'type' next to it")

    def _effective(self, schema: Any, path: Path) -> Any:
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema and seen < 32:
            schema, _ = self._resolve(schema["$ref"], path)
            seen += 1
        return schema

    def _disjoint(self, branches: list[Any], path: Path) -> bool:
        """True when no JSON value can satisfy two branches (types or a discriminating const differ)."""
        resolved = [self._effective(b, path) for b in branches]
        kinds: list[set[str]] = []
        for b in resolved:
            if not isinstance(b, dict):
                return False
            if "const" in b:
                kinds.append({_json_type(b["const"])})
            elif "enum" in b and isinstance(b["enum"], list):
                kinds.append({_json_type(v) for v in b["enum"]})
            elif "type" in b:
                t = b["type"] if isinstance(b["type"], list) else [b["type"]]
                kinds.append(set(t) | ({"integer"} if "number" in t else set()))
            else:
                return False
        if all(not (a & c) for i, a in enumerate(kinds) for c in kinds[i + 1 :]):
            return True
        # Objects told apart by a required property with a different const in each branch.
        if all(k == {"object"} for k in kinds):
            common = set.intersection(*(set(b.get("required") or []) for b in resolved))
            for prop in sorted(common):
                values = []
                for b in resolved:
                    sub = self._effective((b.get("properties") or {}).get(prop), path)
                    if isinstance(sub, dict) and "const" in sub:
                        values.append(json.dumps(sub["const"], sort_keys=True))
                    elif isinstance(sub, dict) and isinstance(sub.get("enum"), list) and len(sub["enum"]) == 1:
                        values.append(json.dumps(sub["enum"][0], sort_keys=True))
                    else:
                        break
                else:
                    if len(set(values)) == len(values):
                        return True
        return False

    def _enum(self, schema: dict[str, Any], path: Path, name: str) -> str:
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(path + (key,), "'enum' must be a non-empty list")
        self._only(schema, path, key, allowed={"type", "enum", "const"})
        if "const" in schema and "enum" in schema:
            values = [v for v in schema["enum"] if v == schema["const"]]
        if "type" in schema:
            types = set(self._types(schema, path))
            values = [v for v in values if _type_matches(v, types)]
        if not values:
            raise SchemaError(path + (key,), f"no value of '{key}' satisfies the rest of the schema")
        self.grammar.primitive("space")
        texts = list(dict.fromkeys(json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values))
        if len(texts) > TRIE_FROM_VALUES:  # shared prefixes: llama.cpp then tracks a few stacks, not N
            return self.grammar.add(name, f"({literal_trie(texts)}) space")
        return self.grammar.add(name, "(" + " | ".join(literal(t) for t in texts) + ") space")

    # -- typed schemas --------------------------------------------------------------------------
    def _typed(self, schema: dict[str, Any], kind: str, path: Path, name: str) -> str:
        g = self.grammar
        if kind == "any":
            return g.primitive("value")
        if kind in ("null", "boolean"):
            return g.primitive(kind)
        if kind in ("integer", "number"):
            return self._number(schema, kind, path, name)
        if kind == "string":
            return self._string(schema, path, name)
        if kind == "array":
            return self._array(schema, path, name)
        return self._object(schema, path, name)

    def _bound(self, schema: dict[str, Any], key: str, path: Path) -> float | None:
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            return None
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SchemaError(path + (key,), f"'{key}' must be a number")
        return value

    def _number(self, schema: dict[str, Any], kind: str, path: Path, name: str) -> str:
        g = self.grammar
        lo_incl, hi_incl = self._bound(schema, "minimum", path), self._bound(schema, "maximum", path)
        lo_excl, hi_excl = self._bound(schema, "exclusiveMinimum", path), self._bound(schema, "exclusiveMaximum", path)
        if schema.get("exclusiveMinimum") is True:  # draft 4: a flag on minimum
            lo_incl, lo_excl = None, lo_incl
        if schema.get("exclusiveMaximum") is True:
            hi_incl, hi_excl = None, hi_incl
        if all(b is None for b in (lo_incl, hi_incl, lo_excl, hi_excl)):
            return g.primitive(kind)
        # Lower bound as (integer, exclusive?), rounded inwards, the tighter of the two kinds.
        lo: tuple[int, bool] | None = None
        for value, exclusive in ((lo_incl, False), (lo_excl, True)):
            if value is None or value < -BIG:
                continue
            if kind == "integer":
                cand = (math.floor(value) + 1, False) if exclusive else (math.ceil(value), False)
            elif float(value).is_integer():
                cand = (int(value), exclusive)
            else:
                cand = (math.ceil(value), False)
            if lo is None or cand[0] > lo[0] or (cand[0] == lo[0] and cand[1]):
                lo = cand
        hi: tuple[int, bool] | None = None
        for value, exclusive in ((hi_incl, False), (hi_excl, True)):
            if value is None or value > BIG:
                continue
            if kind == "integer":
                cand = (math.ceil(value) - 1, False) if exclusive else (math.floor(value), False)
            elif float(value).is_integer():
                cand = (int(value), exclusive)
            else:
                cand = (math.floor(value), False)
            if hi is None or cand[0] < hi[0] or (cand[0] == hi[0] and cand[1]):
                hi = cand
        keyword = (
            "minimum" if "minimum" in schema else "exclusiveMinimum" if "exclusiveMinimum" in schema else "maximum"
        )
        try:
            if kind == "integer":
                body = integer_range(lo[0] if lo else None, hi[0] if hi else None)
            else:
                body = number_range(
                    lo[0] if lo else None,
                    hi[0] if hi else None,
                    lo_exclusive=bool(lo and lo[1]),
                    hi_exclusive=bool(hi and hi[1]),
                )
        except ValueError:
            raise SchemaError(
                path + (keyword,),
                "the bounds leave no value that can be generated (for 'number', only whole-number ranges are enforced)",
            ) from None
        g.primitive("space")
        return g.add(name, f"{body} space")

    def _count(self, schema: dict[str, Any], key: str, path: Path) -> int | None:
        value = schema.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SchemaError(path + (key,), f"'{key}' must be a non-negative integer")
        return value

    def _string(self, schema: dict[str, Any], path: Path, name: str) -> str:
        g = self.grammar
        lo, hi = self._count(schema, "minLength", path), self._count(schema, "maxLength", path)
        fmt = schema.get("format")
        if schema.get("pattern") is not None:
            return self._pattern(schema, path, name, lo, hi)
        if fmt is not None:
            if fmt not in FORMATS:
                raise SchemaError(
                    path + ("format",), f"format '{fmt}' cannot be enforced; supported: {', '.join(sorted(FORMATS))}"
                )
            if lo is not None or hi is not None:
                raise SchemaError(
                    path + ("minLength" if lo is not None else "maxLength",),
                    "length limits together with 'format' cannot be enforced",
                )
            return format_rule(g, fmt)
        if lo is None and hi is None:
            return g.primitive("string")
        if hi is not None and (lo or 0) > hi:
            raise SchemaError(path + ("minLength",), "minLength is greater than maxLength")
        g.primitive("char")
        g.primitive("space")
        reps = f"{{{lo or 0},{'' if hi is None else hi}}}"
        return g.add(name, rf'"\"" char{reps} "\"" space')

    def _pattern(self, schema: dict[str, Any], path: Path, name: str, lo: int | None, hi: int | None) -> str:
        """A string matching `pattern` whole (a subset of the strings containing a match)."""
        pattern = schema["pattern"]
        where = path + ("pattern",)
        if not isinstance(pattern, str):
            raise SchemaError(where, "'pattern' must be a string")
        if schema.get("format") is not None:
            raise SchemaError(path + ("format",), "'format' together with 'pattern' cannot be enforced")
        try:
            tree = regex.parse(pattern)
            body = regex.to_gbnf(tree)
        except regex.RegexError as exc:
            raise SchemaError(where, f"pattern {pattern[:80]!r}: {exc}") from None
        least, most = regex.length_bounds(tree)
        # Length limits beside a pattern hold when every match of the pattern is within them.
        if lo is not None and least < lo:
            raise SchemaError(path + ("minLength",), "minLength is not implied by 'pattern', so it cannot be enforced")
        if hi is not None and (most is None or most > hi):
            raise SchemaError(path + ("maxLength",), "maxLength is not implied by 'pattern', so it cannot be enforced")
        g = self.grammar
        g.primitive("space")
        return g.add(name, rf'"\"" {body} "\"" space')

    @staticmethod
    def _repeat(item: str, lo: int, hi: int | None, sep: str = '"," space') -> str:
        """`item` repeated lo..hi times, separated by `sep` (GBNF, possibly empty)."""
        if hi == 0:
            return '""'
        more_hi = "" if hi is None else str(hi - 1)
        if lo == 0:
            return f"({item} ({sep} {item}){{0,{more_hi}}})?"
        return f"{item} ({sep} {item}){{{lo - 1},{more_hi}}}"

    def _array(self, schema: dict[str, Any], path: Path, name: str) -> str:
        g = self.grammar
        lo = self._count(schema, "minItems", path) or 0
        hi = self._count(schema, "maxItems", path)
        if hi is not None and lo > hi:
            raise SchemaError(path + ("minItems",), "minItems is greater than maxItems")
        if schema.get("uniqueItems") is True and (hi is None or hi > 1):
            raise SchemaError(path + ("uniqueItems",), "uniqueItems cannot be enforced (unless maxItems is 1)")
        prefix = schema.get("prefixItems") or []
        if not isinstance(prefix, list):
            raise SchemaError(path + ("prefixItems",), "'prefixItems' must be a list of schemas")
        items = schema.get("items", True)
        if isinstance(items, list):
            raise SchemaError(path + ("items",), "'items' as a list is not supported; use 'prefixItems'")
        g.primitive("space")
        parts: list[str] = []
        take = len(prefix) if hi is None else min(len(prefix), hi)
        for i in range(take):
            parts.append(self.visit(prefix[i], path + ("prefixItems", i), f"{name}-{i}"))
        seq = ' "," space '.join(parts)
        rest_lo, rest_hi = max(0, lo - take), None if hi is None else hi - take
        if take < len(prefix) or items is False or rest_hi == 0:
            if take < lo:
                raise SchemaError(path + ("minItems",), "minItems cannot be reached with these items")
            body = seq
        else:
            item = self.visit(items, path + ("items",), f"{name}-item")
            if not parts:
                body = self._repeat(item, rest_lo, rest_hi)
            else:
                more = "" if rest_hi is None else str(rest_hi)
                body = f'{seq} ("," space {item}){{{rest_lo},{more}}}'
        return g.add(name, f'"[" space {body} "]" space' if body != '""' else '"[" space "]" space')

    def _object(self, schema: dict[str, Any], path: Path, name: str) -> str:
        g = self.grammar
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise SchemaError(path + ("properties",), "'properties' must be an object")
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(path + ("required",), "'required' must be a list of property names")
        extra = schema.get("additionalProperties", True)
        lo = self._count(schema, "minProperties", path) or 0
        hi = self._count(schema, "maxProperties", path)
        g.primitive("space")
        fields: list[tuple[str, str, bool]] = []  # (key, value rule, required)
        for key, sub in props.items():
            fields.append((key, self.visit(sub, path + ("properties", key), f"{name}-{key}"), key in required))
        for key in dict.fromkeys(required):
            if key in props:
                continue
            if extra is False:
                raise SchemaError(path + ("required",), f"'{key}' is required but additionalProperties is false")
            value = self.visit(
                extra if isinstance(extra, dict) else True, path + ("additionalProperties",), f"{name}-{key}"
            )
            fields.append((key, value, True))
        if not fields:
            if extra is False:
                if lo > 0:
                    raise SchemaError(path + ("minProperties",), "minProperties cannot be reached")
                return g.add(name, '"{" space "}" space')
            value = self.visit(
                extra if isinstance(extra, dict) else True, path + ("additionalProperties",), f"{name}-value"
            )
            kv = g.add(f"{name}-kv", f'{g.primitive("string")} ":" space {value}')
            return g.add(name, f'"{{" space {self._repeat(kv, lo, hi)} "}}" space')
        n_required = sum(1 for f in fields if f[2])
        if lo > n_required:
            raise SchemaError(
                path + ("minProperties",), "minProperties above the number of required properties cannot be enforced"
            )
        if hi is not None and hi < len(fields):
            raise SchemaError(
                path + ("maxProperties",), "maxProperties below the number of properties cannot be enforced"
            )
        kvs = [
            g.add(f"{name}-{key}-kv", f'{literal(json.dumps(key, ensure_ascii=False))} space ":" space {value}')
            for key, value, _ in fields
        ]
        # rest[i][first]: properties i.. in order; `first` says no comma is needed before the next one.
        after: dict[bool, str] = {True: '""', False: '""'}
        for i in range(len(fields) - 1, -1, -1):
            is_required = fields[i][2]
            now: dict[bool, str] = {}
            for first in (True, False):
                lead = "" if first else '"," space '
                take = f"{lead}{kvs[i]} {after[False]}".replace(' ""', "")
                body = take if is_required else f"({take}) | {after[first]}"
                now[first] = g.add(f"{name}-from-{i}{'' if first else '-more'}", body)
            after = now
        inner = after[True]
        return g.add(name, f'"{{" space {inner} "}}" space' if inner != '""' else '"{" space "}" space')


def compile_schema(schema: Any, grammar: Grammar | None = None, *, name: str = "root") -> tuple[Grammar, str]:
    """Compile `schema` into `grammar` (a new one by default); returns it and the schema's rule name."""
    g = grammar or Grammar()
    rule = SchemaCompiler(g, schema, name=name).compile()
    return g, rule
