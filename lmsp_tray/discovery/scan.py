"""Walk the sources, find model files, read their headers (through a cache).

What counts as a model file:

- folder sources (own, custom, LM Studio, llama.cpp): every ``*.gguf`` below
  the root, recursively, following folder links but never the same folder
  twice (no symlink loops), skipping hidden files and folders;
- the Hugging Face cache: the same, but only under
  ``models--*/snapshots/`` (the snapshot files are links into ``blobs/``);
- an Ollama store: each manifest under ``manifests/<host>/<ns>/<model>/<tag>``
  names its weights as the layer with media type
  ``application/vnd.ollama.image.model``, stored as ``blobs/sha256-<hex>``.

Split models (``name-00001-of-00003.gguf`` ...) become one `Found`: the
first part is the path llama.cpp opens, all parts are listed and their sizes
summed; a missing part is an error on that model. Files named ``mmproj`` are
not models: each model found in the same folder is paired with one of them
(its projector, for llama.cpp's multimodal library), as are the projector
layers of Ollama manifests. The catalog skips the other non-model kinds after
reading.

`HeaderCache` remembers each file's header facts (or its error) keyed by
(path, size, mtime_ns) in one JSON file under the cache folder, so a rescan
only reads files that changed. A corrupt or foreign cache file is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp_tray.discovery.entry import GGUFInfo, Projector
from lmsp_tray.discovery.gguf_header import GGUFError, GGUFIncomplete, GGUFReadError, read_gguf_info
from lmsp_tray.discovery.naming import SPLIT_NAME, model_stem, ollama_name, preferred_names, quantization_from_name
from lmsp_tray.discovery.sources import Source

log = logging.getLogger(__name__)

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
PROJECTOR_ORDER = ("F16", "BF16", "Q8_0", "F32")  # which mmproj a folder with several pairs with its models
MAX_DEPTH = 16
MAX_MANIFEST_BYTES = 1 << 20


@dataclass
class Found:
    """One model on disk (a file, a split set or an Ollama blob) before its header is read."""

    source: Source
    order: int  # the source's position in the scan list
    path: Path  # what llama.cpp opens: the file as found (not the link target), part 1 of a split
    files: tuple[Path, ...]
    size: int  # all parts together
    head_size: int  # size and mtime of `path` itself: the header cache key
    head_mtime_ns: int
    identity: tuple[int, int] | None  # (st_dev, st_ino) of `path`'s target, to drop duplicates
    stem: str  # file name for rule 3 ids (split suffix removed)
    names: tuple[str, ...] = ()  # Ollama names, best first
    error: str | None = None  # a problem known without reading (a missing part or blob)
    readable: bool = True  # False: there is no header to read (part 1 or the blob is missing)
    split_count: int = 1  # parts the file names promise (1 for a lone file)
    projector: tuple[str, os.stat_result] | None = None  # the mmproj file paired with it, and its stat

    @property
    def sort_key(self) -> tuple[int, int, str]:
        return (self.source.rank, self.order, str(self.path))


def find_models(sources: Sequence[Source]) -> list[Found]:
    """Everything every source holds, in precedence order (duplicates not yet removed)."""
    out: list[Found] = []
    for order, source in enumerate(sources):
        try:
            if source.layout == "ollama":
                out.extend(ollama_models(source, order))
            else:
                out.extend(folder_models(source, order))
        except OSError as exc:  # an unreadable root: nothing from it, the scan goes on
            log.debug("skipping %s: %s", source.root, exc)
        except Exception:  # a bug must cost one folder, not the whole catalog
            log.warning("could not scan %s", source.root, exc_info=True)
    out.sort(key=lambda f: f.sort_key)
    return out


# -- folders ------------------------------------------------------------------------------------
def walk_gguf(root: Path, *, huggingface: bool = False) -> Iterator[tuple[str, os.stat_result]]:
    """(path, stat of its target) for each regular ``*.gguf`` below `root`."""
    try:
        top = os.stat(root)
    except OSError:
        return
    if not stat.S_ISDIR(top.st_mode):
        return
    seen = {(top.st_dev, top.st_ino)}
    stack: list[tuple[str, int]] = [(str(root), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except OSError:
            continue
        for item in items:
            name = item.name
            if name.startswith("."):
                continue
            try:
                if item.is_dir():
                    if depth >= MAX_DEPTH:
                        continue
                    if huggingface and depth == 0 and not name.startswith("models--"):
                        continue
                    if huggingface and depth == 1 and name != "snapshots":
                        continue
                    st = os.stat(item.path)  # not item.stat(): on Windows its st_ino is always 0
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        stack.append((item.path, depth + 1))
                elif name[-5:].lower() == ".gguf":
                    st = os.stat(item.path)  # follows links; a dangling one raises and is skipped
                    if stat.S_ISREG(st.st_mode):
                        yield item.path, st
            except OSError:
                continue


def folder_models(source: Source, order: int) -> list[Found]:
    out: list[Found] = []
    splits: dict[tuple[str, str, int], dict[int, tuple[str, os.stat_result]]] = {}
    projectors: dict[str, list[tuple[str, os.stat_result]]] = {}
    for path, st in walk_gguf(source.root, huggingface=source.layout == "huggingface"):
        name = os.path.basename(path)
        if "mmproj" in name.lower():
            projectors.setdefault(os.path.dirname(path), []).append((path, st))
            continue
        match = SPLIT_NAME.match(name)
        if match:
            no, count = int(match.group("no")), int(match.group("count"))
            if 1 <= no <= count:
                key = (os.path.dirname(path), match.group("prefix"), count)
                splits.setdefault(key, {})[no] = (path, st)
                continue
        out.append(_found(source, order, path, st, (Path(path),), st.st_size, model_stem(name)))
    for (_, prefix, count), parts in splits.items():
        out.append(_split_found(source, order, prefix, count, parts))
    for folder, candidates in projectors.items():
        _pair(candidates, [f for f in out if os.path.dirname(f.path) == folder])
    return out


def _pair(projectors: list[tuple[str, os.stat_result]], models: list[Found]) -> None:
    """Give each model of a folder its projector: one whose name names the model
    (``mmproj-google_gemma-3-4b-it-f16.gguf`` for ``google_gemma-3-4b-it-Q4_K_M.gguf``), else one named
    for no model there (``mmproj-F16.gguf``, ``mmproj-model-f16.gguf``: a repository's own projector),
    never another model's."""
    named = {p[0]: _projector_name(p[0]) for p in projectors}
    claimed = {path for path, name in named.items() if name and any(name in _letters(f.stem) for f in models)}
    for f in models:
        own = [p for p in projectors if p[0] in claimed and named[p[0]] in _letters(f.stem)]
        spare = [p for p in projectors if p[0] not in claimed]
        if own or spare:
            f.projector = min(own or spare, key=_projector_rank)


def _letters(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _projector_name(path: str) -> str:
    """The model a projector file names, letters and digits only ("" when it names none)."""
    stem = model_stem(os.path.basename(path)).lower().replace("mmproj", "")
    quant = quantization_from_name(stem)
    if quant:
        stem = stem.replace(quant.lower(), "")
    return _letters(stem)


def _projector_rank(item: tuple[str, os.stat_result]) -> tuple[int, str]:
    """F16 first (what llama.cpp's own conversions give), then BF16, Q8_0, F32, then by name."""
    quant = (quantization_from_name(model_stem(os.path.basename(item[0]))) or "").upper()
    return (PROJECTOR_ORDER.index(quant) if quant in PROJECTOR_ORDER else len(PROJECTOR_ORDER), item[0])


def _found(
    source: Source, order: int, path: str, st: os.stat_result, files: tuple[Path, ...], size: int, stem: str, **kw: Any
) -> Found:
    return Found(
        source=source,
        order=order,
        path=Path(path),
        files=files,
        size=size,
        head_size=st.st_size,
        head_mtime_ns=st.st_mtime_ns,
        identity=(st.st_dev, st.st_ino),
        stem=stem,
        **kw,
    )


def _split_found(
    source: Source, order: int, prefix: str, count: int, parts: dict[int, tuple[str, os.stat_result]]
) -> Found:
    files = tuple(Path(parts[n][0]) for n in sorted(parts))
    size = sum(parts[n][1].st_size for n in parts)
    missing = [n for n in range(1, count + 1) if n not in parts]
    error = None
    if missing:
        names = ", ".join(f"{prefix}-{n:05d}-of-{count:05d}.gguf" for n in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        error = f"split model is incomplete: {len(missing)} of its {count} parts are missing ({names}{more})"
    first = parts.get(1) or parts[min(parts)]
    return _found(
        source, order, first[0], first[1], files, size, prefix, error=error, readable=1 in parts, split_count=count
    )


# -- Ollama -------------------------------------------------------------------------------------
def ollama_models(source: Source, order: int) -> list[Found]:
    manifests = source.root / "manifests"
    blobs = source.root / "blobs"
    by_blob: dict[str, tuple[list[str], int]] = {}  # blob path -> (names, declared size)
    projector_of: dict[str, Path] = {}  # model blob path -> its projector blob
    out: list[Found] = []
    for path, rel in _manifest_files(manifests):
        host, namespace, model, tag = rel[0], "/".join(rel[1:-2]), rel[-2], rel[-1]
        name = ollama_name(host, namespace, model, tag)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read(MAX_MANIFEST_BYTES))
            layers = [layer for layer in doc.get("layers", []) if isinstance(layer, dict)]
        except (OSError, ValueError, AttributeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)  # no file paths in messages
            out.append(
                _missing(source, order, Path(path), (name,), 0, f"unreadable Ollama manifest for '{name}': {why}")
            )
            continue
        model_layers = [layer for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER]
        if not model_layers:
            continue  # no GGUF weights (nothing llama.cpp could run)
        layer = model_layers[0]
        blob = _blob_path(blobs, str(layer.get("digest", "")))
        declared_size = layer.get("size")
        size = declared_size if isinstance(declared_size, int) else 0
        by_blob.setdefault(str(blob), ([], size))[0].append(name)
        projector_layers = [layer for layer in layers if layer.get("mediaType") == OLLAMA_PROJECTOR_LAYER]
        if projector_layers:
            projector_of[str(blob)] = _blob_path(blobs, str(projector_layers[0].get("digest", "")))
    for blob_path, (names, declared) in by_blob.items():
        best = tuple(preferred_names(names))
        try:
            st = os.stat(blob_path)
        except OSError:
            out.append(
                _missing(
                    source,
                    order,
                    Path(blob_path),
                    best,
                    declared,
                    f"Ollama model '{best[0]}' is missing its weights file {Path(blob_path).name}; "
                    f"`ollama pull {best[0]}` restores it",
                )
            )
            continue
        found = _found(source, order, blob_path, st, (Path(blob_path),), st.st_size, best[0], names=best)
        projector = projector_of.get(blob_path)
        if projector is not None:
            with contextlib.suppress(OSError):  # a missing projector blob: the model is text only
                found.projector = (str(projector), os.stat(projector))
        out.append(found)
    return out


def _missing(source: Source, order: int, path: Path, names: tuple[str, ...], size: int, error: str) -> Found:
    """A model known to exist (by its manifest) whose file cannot be read at all."""
    return Found(
        source=source,
        order=order,
        path=path,
        files=(),
        size=size,
        head_size=0,
        head_mtime_ns=0,
        identity=None,
        stem=names[0],
        names=names,
        error=error,
        readable=False,
    )


def _manifest_files(root: Path) -> Iterator[tuple[str, list[str]]]:
    """(path, [host, namespace..., model, tag]) for each manifest file."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(folder, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if len(parts) < 3:
            continue
        for name in sorted(files):
            if not name.startswith("."):
                yield os.path.join(folder, name), parts + [name]


def _blob_path(blobs: Path, digest: str) -> Path:
    """``blobs/sha256-<hex>`` (older stores on Linux/macOS used ``sha256:<hex>``)."""
    modern = blobs / digest.replace(":", "-")
    if not modern.exists() and (blobs / digest).exists():
        return blobs / digest
    return modern


# -- headers ------------------------------------------------------------------------------------
@dataclass
class Header:
    """What reading a Found's header gave: facts, or why there are none."""

    info: GGUFInfo | None
    error: str | None
    cached: bool = False
    transient: bool = False  # an I/O failure that may pass: not remembered in the cache
    incomplete: bool = False  # the file ends too early (being written, or cut short)


class HeaderCache:
    """Header facts by (path, size, mtime_ns), kept in memory and in a JSON file."""

    VERSION = 2

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self._items: dict[str, list[Any]] = {}
        self._loaded = False
        self._dirty = False
        self._lock = threading.Lock()
        self._fields = tuple(f.name for f in dataclasses.fields(GGUFInfo))
        self._schema = f"{self.VERSION}:" + ",".join(self._fields)

    def _load(self) -> None:
        self._loaded = True
        if self.file is None:
            return
        try:
            doc = json.loads(self.file.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and doc.get("schema") == self._schema and isinstance(doc.get("items"), dict):
                self._items = {k: v for k, v in doc["items"].items() if isinstance(v, list) and len(v) == 5}
        except (OSError, ValueError, UnicodeDecodeError):
            self._items = {}

    def get(self, path: str, size: int, mtime_ns: int) -> Header | None:
        with self._lock:
            if not self._loaded:
                self._load()
            item = self._items.get(path)
        if not item or item[0] != size or item[1] != mtime_ns:
            return None
        try:
            info = GGUFInfo(**item[2]) if isinstance(item[2], dict) else None
        except TypeError:
            return None
        error = item[3] if isinstance(item[3], str) else None
        if info is None and error is None:
            return None
        return Header(info, error, cached=True, incomplete=bool(item[4]) and error is not None)

    def put(self, path: str, size: int, mtime_ns: int, header: Header) -> None:
        info = {name: getattr(header.info, name) for name in self._fields} if header.info is not None else None
        with self._lock:
            self._items[path] = [size, mtime_ns, info, header.error, header.incomplete]
            self._dirty = True

    def save(self, keep: set[str]) -> None:
        """Forget files not seen in the last scan, then write the file if anything changed."""
        with self._lock:
            stale = [k for k in self._items if k not in keep]
            for k in stale:
                del self._items[k]
            if not (self._dirty or stale) or self.file is None:
                return
            doc = {"schema": self._schema, "items": self._items}
            self._dirty = False
            try:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
                os.replace(tmp, self.file)
            except OSError as exc:
                log.debug("could not write the header cache %s: %s", self.file, exc)


def read_header(path: Path) -> Header:
    try:
        return Header(read_gguf_info(path), None)
    except GGUFIncomplete as exc:
        return Header(exc.info, str(exc), incomplete=True)
    except GGUFError as exc:
        return Header(None, str(exc), transient=isinstance(exc, GGUFReadError))
    except Exception as exc:  # a reader bug must cost one model, not the whole scan
        log.warning("unexpected failure reading the header of %s", path, exc_info=True)
        return Header(None, f"could not read the GGUF header ({type(exc).__name__})", transient=True)


def projector_of(f: Found, cache: HeaderCache) -> Projector | None:
    """The projector paired with `f`, with the inputs its header says it encodes (through the cache);
    None when there is none, or its header cannot be read or is not a projector's."""
    if f.projector is None:
        return None
    path, st = f.projector
    header = cache.get(path, st.st_size, st.st_mtime_ns)
    if header is None:
        header = read_header(Path(path))
        if not header.transient:
            cache.put(path, st.st_size, st.st_mtime_ns, header)
    info = header.info
    if header.error is not None or info is None or info.kind != "mmproj":
        return None
    return Projector(Path(path), st.st_size, vision=info.vision_encoder, audio=info.audio_encoder)


def read_headers(found: Sequence[Found], cache: HeaderCache, workers: int = 1) -> tuple[list[Header | None], int]:
    """The header of each readable Found (None for the others), and how many came from the cache."""
    results: list[Header | None] = [None] * len(found)
    misses: list[int] = []
    hits = 0
    for i, f in enumerate(found):
        if not f.readable:
            continue
        cached = cache.get(str(f.path), f.head_size, f.head_mtime_ns)
        if cached is not None:
            results[i] = cached
            hits += 1
        else:
            misses.append(i)
    if workers > 1 and len(misses) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(misses)), thread_name_prefix="gguf-header") as pool:
            headers = list(pool.map(read_header, [found[i].path for i in misses]))
    else:
        headers = [read_header(found[i].path) for i in misses]
    for i, header in zip(misses, headers):
        results[i] = header
        if not header.transient:
            cache.put(str(found[i].path), found[i].head_size, found[i].head_mtime_ns, header)
    return results, hits
