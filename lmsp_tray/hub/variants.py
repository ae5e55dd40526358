"""A repository's GGUF files as the variants a person chooses between, and the default choice.

A GGUF repository usually holds one model in many quantizations: one file
each (``Model-Q4_K_M.gguf``), big ones split llama.cpp-style into parts
(``Q8_0/Model-Q8_0-00001-of-00002.gguf`` …), and for vision models one or
more projector files (``mmproj-F16.gguf``). `variants` groups the files into
`Variant`s (a split set is one variant, fetched whole), `choose` picks the one
asked for — or, with no tag, the default the way Ollama does for ``hf.co``
names: Q4_K_M when the repository has it, else the nearest sensible
quantization — and says why; `projector_for` picks the ``mmproj`` file that
comes along.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lmsp_tray.discovery.naming import SPLIT_NAME, model_stem, quantization_from_name
from lmsp_tray.hub.errors import HubFileNotFound

DEFAULT_QUANT = "Q4_K_M"
# When a repository has no Q4_K_M: the closest trade-off of size and quality first, the big ones last.
FALLBACK_ORDER = (
    "Q4_K_M",
    "Q4_K_S",
    "Q4_K_L",
    "IQ4_XS",
    "IQ4_NL",
    "Q4_0",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_0",
    "Q6_K",
    "Q8_0",
    "Q3_K_L",
    "Q3_K_M",
    "IQ3_M",
    "Q3_K_S",
    "IQ3_XS",
    "Q2_K",
    "IQ2_M",
    "BF16",
    "F16",
    "F32",
)
PROJECTOR_ORDER = ("F16", "BF16", "Q8_0", "F32")


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository at a commit, as the Hub lists it."""

    path: str
    size: int
    sha256: str | None = None  # LFS files: the content's SHA-256 (what the cache names the blob)
    blob_id: str | None = None  # the git blob id (SHA-1), for files stored in git itself

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def is_gguf(self) -> bool:
        return self.path.lower().endswith(".gguf")

    @property
    def is_projector(self) -> bool:
        return self.is_gguf and "mmproj" in self.name.lower()


@dataclass(frozen=True)
class Variant:
    """One runnable model in the repository: a file, or every part of a split set (part 1 first)."""

    quant: str | None
    files: tuple[RemoteFile, ...]
    missing_parts: int = 0  # a split set the repository holds only partly (cannot be run)

    @property
    def first(self) -> RemoteFile:
        return self.files[0]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def label(self) -> str:
        """The tag to ask for it by (the quantization), else the file name."""
        return self.quant or model_stem(self.first.name)

    @property
    def split(self) -> bool:
        return len(self.files) > 1 or self.missing_parts > 0


@dataclass(frozen=True)
class Choice:
    variant: Variant
    reason: str  # says why this one, for the CLI and the task's first event


def variants(files: Iterable[RemoteFile]) -> list[Variant]:
    """The repository's runnable GGUF variants (projectors left out), ordered by size."""
    singles: list[Variant] = []
    splits: dict[tuple[str, str, int], dict[int, RemoteFile]] = {}
    for f in files:
        if not f.is_gguf or f.is_projector:
            continue
        match = SPLIT_NAME.match(f.name)
        if match:
            no, count = int(match.group("no")), int(match.group("count"))
            if 1 <= no <= count:
                key = (posixpath.dirname(f.path), match.group("prefix"), count)
                splits.setdefault(key, {})[no] = f
                continue
        singles.append(Variant(_quant_of(f.path), (f,)))
    for (_, _prefix, count), parts in splits.items():
        ordered = tuple(parts[n] for n in sorted(parts))
        singles.append(Variant(_quant_of(ordered[0].path), ordered, missing_parts=count - len(parts)))
    return sorted(singles, key=lambda v: (v.size, v.first.path))


def choose(found: Sequence[Variant], repo_id: str, *, quant: str | None = None, filename: str | None = None) -> Choice:
    """The variant asked for (a quantization tag or a file), or the default; `HubFileNotFound` if none."""
    usable = [v for v in found if not v.missing_parts]
    if not found:
        raise HubFileNotFound(f"The repository {repo_id} has no GGUF model files; lmsp-tray runs GGUF models only.")
    if filename is not None:
        for v in found:
            if any(f.path == filename for f in v.files):
                _complete(v, repo_id)
                part = "" if v.first.path == filename else f" (part of a split model: all {len(v.files)} parts come)"
                return Choice(v, f"the file you named{part}")
        raise HubFileNotFound(
            f"The repository {repo_id} has no file {filename}. Its GGUF files: {_listing(found)}.",
            param="model",
        )
    if quant is not None:
        matching = [v for v in found if v.quant and v.quant.upper() == quant.upper()]
        if not matching:
            matching = [v for v in found if quant.upper() in v.first.path.upper()]
        if not matching:
            raise HubFileNotFound(
                f"The repository {repo_id} has no {quant} variant. Available: {_tags(found)}.", param="model"
            )
        best = min(matching, key=lambda v: (bool(v.missing_parts), len(v.first.path), v.first.path))
        _complete(best, repo_id)
        if (best.quant or "").upper() == quant.upper():
            return Choice(best, f"{best.label}, as asked")
        return Choice(best, f"{best.label}: no variant is tagged {quant}; this one's file name contains it")
    if not usable:
        _complete(found[0], repo_id)
    if len(usable) == 1:
        return Choice(usable[0], f"{usable[0].label}: the only GGUF model in the repository")
    by_quant = {v.quant.upper(): v for v in reversed(usable) if v.quant}
    for rank, tag in enumerate(FALLBACK_ORDER):
        if tag in by_quant:
            v = by_quant[tag]
            if rank == 0:
                return Choice(v, f"{DEFAULT_QUANT}: the default when the repository has it")
            return Choice(
                v, f"{v.label}: the repository has no {DEFAULT_QUANT}, and {v.label} is the closest trade-off it has"
            )
    return Choice(usable[0], f"{usable[0].label}: the smallest GGUF model in the repository")


def projector_for(files: Iterable[RemoteFile], variant: Variant) -> RemoteFile | None:
    """The ``mmproj`` file a (vision) model in this repository needs, if the repository has one.

    Preference: one in the variant's own folder, then F16, BF16, Q8_0, F32, then the first by name.
    """
    projectors = [f for f in files if f.is_projector]
    if not projectors:
        return None
    folder = posixpath.dirname(variant.first.path)

    def rank(f: RemoteFile) -> tuple[int, int, str]:
        quant = (quantization_from_name(f.name) or "").upper()
        order = PROJECTOR_ORDER.index(quant) if quant in PROJECTOR_ORDER else len(PROJECTOR_ORDER)
        return (0 if posixpath.dirname(f.path) == folder else 1, order, f.path)

    return min(projectors, key=rank)


def _quant_of(path: str) -> str | None:
    name = model_stem(posixpath.basename(path))
    return quantization_from_name(name) or quantization_from_name(posixpath.dirname(path).replace("/", "-"))


def _complete(variant: Variant, repo_id: str) -> None:
    if variant.missing_parts:
        raise HubFileNotFound(
            f"The repository {repo_id} holds only {len(variant.files)} of the "
            f"{len(variant.files) + variant.missing_parts} parts of {variant.label}; it cannot be run. "
            "Choose another quantization."
        )


def _tags(found: Sequence[Variant]) -> str:
    return ", ".join(sorted({v.label for v in found})) or "none"


def _listing(found: Sequence[Variant]) -> str:
    names = [v.first.path for v in found]
    return ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
