"""Discovery pairs a model with the multimodal projector (mmproj) beside it: in its folder, in its Hugging
Face snapshot, or as the projector layer of its Ollama manifest. A projector alone is never a model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from discovery_support import hf_snapshot_file, ollama_blob, ollama_manifest, sha256_of
from gguf_factory import write_tiny_gguf, write_tiny_mmproj_gguf, write_tiny_vision_pair

from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.catalog import Catalog


def _catalog(tmp: Path, custom: Path, home: Path) -> Catalog:
    paths = Paths(tmp / "lmsp" / "config", tmp / "lmsp" / "data", tmp / "lmsp" / "cache", tmp / "lmsp" / "run")
    cfg = Config(models_dirs=[custom])
    return Catalog.from_config(paths, cfg, environ={}, home=home, platform="linux", include_system=False, workers=1)


def test_projectors_pair_with_their_models_and_are_not_listed(tmp_path: Path) -> None:
    home, custom = tmp_path / "home", tmp_path / "custom"
    write_tiny_vision_pair(custom / "vision", name="seer")
    write_tiny_gguf(custom / "vision" / "other.gguf", basename="other")  # the projector names another model
    write_tiny_gguf(custom / "text" / "plain.gguf", basename="plain")
    # LM Studio: publisher/repo/ holds the model and its projector (two projectors: F16 is chosen)
    lms = home / ".lmstudio" / "models" / "pub" / "Seer-GGUF"
    write_tiny_gguf(lms / "Seer-Q8_0.gguf", basename="lms-seer")
    write_tiny_mmproj_gguf(lms / "mmproj-Seer-F32.gguf")
    write_tiny_mmproj_gguf(lms / "mmproj-Seer-F16.gguf")
    # Hugging Face cache: a snapshot with both files
    staging = tmp_path / "staging"
    model, projector = write_tiny_vision_pair(staging, name="hf-seer")
    hub = home / ".cache" / "huggingface" / "hub"
    hf_snapshot_file(hub, "org/Seer-GGUF", "abc", model.name, model)
    hf_snapshot_file(hub, "org/Seer-GGUF", "abc", projector.name, projector)
    # Ollama: the projector is a layer of the manifest
    store = home / ".ollama" / "models"
    digest = ollama_blob(store, basename="ollama-seer", seed=4)
    incoming = write_tiny_mmproj_gguf(store / "blobs" / "incoming.gguf")
    projector_digest = "sha256:" + sha256_of(incoming)
    os.replace(incoming, store / "blobs" / projector_digest.replace(":", "-"))
    layer = {"mediaType": "application/vnd.ollama.image.projector", "digest": projector_digest, "size": 1}
    ollama_manifest(store, "registry.ollama.ai/library/seer/latest", digest, extra_layers=[layer])
    shutil.rmtree(staging)

    catalog = _catalog(tmp_path, custom, home)
    entries = catalog.entries()
    assert not [e for e in entries if "mmproj" in e.path.name], "a projector alone is not a model"
    by_path = {e.path.name: e for e in entries}
    seer = by_path["seer.gguf"]
    assert seer.projector is not None and seer.projector.path.name == "mmproj-seer.gguf"
    assert seer.projector.vision and not seer.projector.audio
    assert seer.vision and seer.input_modalities == ["text", "image"]
    assert by_path["plain.gguf"].projector is None and by_path["plain.gguf"].input_modalities == ["text"]
    assert by_path["other.gguf"].projector is None
    lms_seer = by_path["Seer-Q8_0.gguf"]
    assert lms_seer.projector is not None and lms_seer.projector.path.name == "mmproj-Seer-F16.gguf"
    assert by_path["hf-seer.gguf"].vision
    ollama = next(e for e in entries if e.source == "ollama")
    assert ollama.projector is not None and ollama.projector.path.name == projector_digest.replace(":", "-")
    assert ollama.vision
    report = catalog.last_report
    assert report is not None and report.models == len(entries) == 6
    # a rescan reads the projectors' headers from the cache and pairs them the same
    again = _catalog(tmp_path, custom, home).entries()
    assert [e.projector for e in again] == [e.projector for e in entries]
