"""Build the places discovery scans, for real, in a temporary folder.

Each helper lays files out exactly as the tool it imitates does on disk: an
Ollama store (manifests pointing at content-addressed blobs), a Hugging Face
hub cache (snapshot names linked to blobs), LM Studio's publisher/repo
folders. The model files are real GGUFs from `gguf_factory` (or, for
header-only cases such as a vocab-only file, written with the `gguf` package
directly).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gguf_factory import vocabulary, write_tiny_gguf


def write_header_only(
    path: Path,
    *,
    arch: str = "llama",
    kv: dict[str, Any] | None = None,
    tokens: Sequence[str] | None = None,
    tensors: int = 0,
) -> Path:
    """A GGUF with the given metadata and `tensors` small f32 tensors (0: a vocab-only file)."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    if tokens is not None:
        writer.add_token_list(list(tokens))
    for key, value in (kv or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        else:
            writer.add_uint32(key, int(value))
    for i in range(tensors):
        writer.add_tensor(f"t{i}.weight", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_vocab_only(path: Path) -> Path:
    tokens, _, _ = vocabulary()
    return write_header_only(path, kv={"tokenizer.ggml.model": "llama"}, tokens=tokens)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ollama_blob(store: Path, **model: Any) -> str:
    """Write a tiny model into ``blobs/sha256-<hex>`` (content-addressed) and return the digest."""
    tmp = store / "blobs" / "incoming.gguf"
    write_tiny_gguf(tmp, **model)
    digest = "sha256:" + sha256_of(tmp)
    os.replace(tmp, store / "blobs" / digest.replace(":", "-"))
    return digest


def ollama_manifest(
    store: Path, name_path: str, model_digest: str, *, size: int = 0, extra_layers: Sequence[dict[str, Any]] = ()
) -> Path:
    """``manifests/<host>/<namespace>/<model>/<tag>`` pointing at a model blob."""
    path = store / "manifests" / name_path
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:0", "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": model_digest, "size": size},
            *extra_layers,
        ],
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def hf_snapshot_file(hub: Path, repo: str, revision: str, filename: str, source: Path) -> Path:
    """Put `source` in the HF cache as ``models--org--name``: a blob plus a snapshot link to it."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    blob = repo_dir / "blobs" / sha256_of(source)
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        shutil.copyfile(source, blob)
    link = repo_dir / "snapshots" / revision / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return link


def cut(source: Path, target: Path, length: int) -> Path:
    """A copy of the first `length` bytes of `source` (an interrupted download)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as src:
        target.write_bytes(src.read(length))
    return target


def kv_section_end(path: Path) -> int:
    """The offset where a GGUF's key/value section ends (the tensor table starts)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = max(reader.fields.values(), key=lambda f: f.offset)
    return field.offset + sum(p.nbytes for p in field.parts)
