"""What discovery offers, llama.cpp can open; what it marks broken, llama.cpp refuses too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from discovery_support import cut, hf_snapshot_file, ollama_blob, ollama_manifest
from gguf_factory import write_tiny_gguf

from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.catalog import Catalog

llama_cpp = pytest.importorskip("llama_cpp")


def _load(path: Path) -> int:
    model = llama_cpp.Llama(model_path=os.fspath(path), n_ctx=64, n_threads=1, verbose=False)
    try:
        return model.n_vocab()
    finally:
        model.close()


def test_discovered_models_load_in_llama_cpp(tmp_path: Path) -> None:
    home = tmp_path / "home"
    hub = home / ".cache" / "huggingface" / "hub"
    first = write_tiny_gguf(tmp_path / "src" / "big.gguf", basename="hf-split", size_label="1M", split_max_tensors=8)
    for n in (1, 2, 3):  # parts as links to hash-named blobs: llama.cpp finds parts 2-3 by part 1's name
        part = first.with_name(f"big-{n:05d}-of-00003.gguf")
        hf_snapshot_file(hub, "org/split-GGUF", "main", part.name, part)
    store = home / ".ollama" / "models"
    ollama_manifest(store, "registry.ollama.ai/library/tiny/1m", ollama_blob(store, basename="o", seed=2))
    good = write_tiny_gguf(tmp_path / "src" / "good.gguf", seed=3)
    custom = tmp_path / "custom"
    cut(good, custom / "short.gguf", good.stat().st_size - 4096)
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")
    catalog = Catalog.from_config(paths, Config(models_dirs=[custom]), environ={}, home=home, include_system=False)
    by_id = {e.id: e for e in catalog.scan()}
    assert set(by_id) == {"hf-split:1m-f32", "tiny:1m", "tiny-test:1m-f32"}  # short.gguf: its header's id

    split = by_id["hf-split:1m-f32"]
    assert split.ok and len(split.files) == 3 and split.info
    assert _load(split.path) == split.info.vocab_size
    blob = by_id["tiny:1m"]
    assert blob.ok and blob.path.parent.name == "blobs" and blob.info
    assert _load(blob.path) == blob.info.vocab_size

    short = by_id["tiny-test:1m-f32"]
    assert short.path.name == "short.gguf" and short.error and "truncated" in short.error and short.incomplete
    with pytest.raises(ValueError):
        _load(short.path)
