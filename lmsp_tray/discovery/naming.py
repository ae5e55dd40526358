"""Model ids (PROFILE §3): readable, stable across restarts, unique.

Rules, applied in this order:

1. A model found in an Ollama store keeps its Ollama name: ``llama3.2:3b``
   for ``registry.ollama.ai/library``, ``namespace/model:tag`` for another
   namespace, ``host/namespace/model:tag`` for another registry (case kept).
   When several names point at one blob, the entry takes the first of them
   by (tag ``latest`` last, then alphabetical) and keeps the others as
   aliases.
2. Otherwise, when the GGUF header has ``general.basename`` and
   ``general.size_label``: ``basename:size_label-quantization``, lower-case
   (``gemma-3:270m-q4_k_m``); the quantization comes from
   ``general.file_type``, else from the file name, and is left out (with its
   dash) when neither says.
3. Otherwise the file name without ``.gguf`` (and without a split suffix
   ``-00001-of-00003``), lower-case.

Characters other than ``a-z 0-9 . _ -`` become ``-`` in rules 2 and 3.

Clashes (compared case-insensitively): the entries sharing an id are ordered
by (source family precedence: lmsp-tray, custom, lm-studio, ollama,
huggingface, llama.cpp; then the file's path). The first keeps the id; each
other one gets ``-`` and the first 6 hex digits of the SHA-256 of its path
(more digits in the unlikely case those clash too). The id of a file thus
depends only on the set of files present, never on scan order or history.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from lmsp_tray.discovery.entry import GGUFInfo

SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:I?Q|TQ)[1-8](?:_[A-Za-z0-9]+)*|BF16|FP?16|FP?32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_DASHES = re.compile(r"-{2,}")
SUFFIX_LENGTHS = (6, 10, 16, 64)


def quantization_from_name(name: str) -> str | None:
    """ "Q4_K_M" from "Llama-3.2-1B-Instruct-Q4_K_M.gguf" (the last match wins); None if none."""
    found = _QUANT.findall(name)
    if not found:
        return None
    quant = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(quant, quant)


def slug(text: str) -> str:
    """Lower-case, with anything outside ``a-z 0-9 . _ -`` turned into single dashes."""
    out = _DASHES.sub("-", _UNSAFE.sub("-", text.strip().lower()))
    return out.strip("-._")


def model_stem(file_name: str) -> str:
    """The file name without ``.gguf`` and without a ``-00001-of-00003`` split suffix."""
    match = SPLIT_NAME.match(file_name)
    if match:
        return match.group("prefix")
    return file_name[:-5] if file_name.lower().endswith(".gguf") else file_name


def base_id(info: GGUFInfo | None, stem: str) -> str:
    """The id rules 2 and 3 give a file (before clashes are resolved)."""
    if info is not None and info.basename and info.size_label:
        name, size = slug(info.basename), slug(info.size_label)
        if name and size:
            quant = slug(info.quantization) if info.quantization else ""
            return f"{name}:{size}-{quant}" if quant else f"{name}:{size}"
    return slug(stem) or "model"


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows for ``manifests/<host>/<namespace>/<model>/<tag>``."""
    if host == "registry.ollama.ai":
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def preferred_names(names: Sequence[str]) -> list[str]:
    """Ollama names for one blob, best first: specific tags before ``latest``, then alphabetical."""
    return sorted(set(names), key=lambda n: (n.rsplit(":", 1)[-1] == "latest", n))


def unique_ids(candidates: Sequence[tuple[str, tuple[int, str]]]) -> list[str]:
    """Final ids for (base id, (family rank, path)) pairs, in the same order; see the module doc."""
    groups: dict[str, list[int]] = {}
    for index, (base, _) in enumerate(candidates):
        groups.setdefault(base.lower(), []).append(index)
    result: list[str | None] = [None] * len(candidates)
    used: set[str] = set()
    losers: list[int] = []
    for members in groups.values():
        members.sort(key=lambda i: candidates[i][1])
        winner = members[0]
        result[winner] = candidates[winner][0]
        used.add(candidates[winner][0].lower())
        losers.extend(members[1:])
    for index in sorted(losers, key=lambda i: (candidates[i][0].lower(), candidates[i][1])):
        base, (_, path) = candidates[index]
        digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()
        for length in SUFFIX_LENGTHS:
            chosen = f"{base}-{digest[:length]}"
            if chosen.lower() not in used:
                break
        else:  # the same path twice: cannot happen after de-duplication, but never loop forever
            n = 2
            while f"{chosen}-{n}".lower() in used:
                n += 1
            chosen = f"{chosen}-{n}"
        used.add(chosen.lower())
        result[index] = chosen
    return [r for r in result if r is not None]
