"""The catalog over a fake home laid out like LM Studio, Ollama, the HF cache and llama.cpp's cache.

All model files are real GGUFs; the bad ones are real files broken the way
files break in the wild (cut short, wrong content, missing parts).
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from discovery_support import (
    cut,
    hf_snapshot_file,
    kv_section_end,
    ollama_blob,
    ollama_manifest,
    write_header_only,
    write_vocab_only,
)
from gguf_factory import write_tiny_gguf

from lmsp_tray.config import Config, Paths
from lmsp_tray.discovery.catalog import Catalog, header_cache_file
from lmsp_tray.discovery.entry import ModelEntry


@dataclass
class World:
    home: Path
    paths: Paths
    custom: Path
    files: dict[str, Path]

    def catalog(self, **config: object) -> Catalog:
        cfg = Config(models_dirs=[self.custom], **config)  # type: ignore[arg-type]
        return Catalog.from_config(
            self.paths, cfg, environ={}, home=self.home, platform="linux", include_system=False, workers=2
        )


def _suffix(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:6]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("world")
    home = tmp / "home"
    paths = Paths(tmp / "lmsp" / "config", tmp / "lmsp" / "data", tmp / "lmsp" / "cache", tmp / "lmsp" / "run")
    custom = tmp / "custom"
    f: dict[str, Path] = {}
    # the service's own folder
    f["own"] = write_tiny_gguf(paths.models_dir / "own.gguf", basename="own", size_label="2M", file_type=7)
    # LM Studio: publisher/repo/file, and the legacy folder with a metadata-less file
    lms = home / ".lmstudio" / "models"
    f["lms"] = write_tiny_gguf(
        lms / "lmstudio-community" / "Tiny-GGUF" / "tiny-Q4_K_M.gguf",
        basename="Tiny Chat",
        size_label="1M",
        file_type=15,
    )
    f["legacy"] = write_tiny_gguf(
        home / ".cache" / "lm-studio" / "models" / "TheBloke" / "Old-GGUF" / "Old-Model.Q5_K_M.gguf",
        basename=None,
        size_label=None,
        file_type=None,
    )
    # Ollama: a library model under two tags, a namespaced one, one from hf.co, one with its blob gone
    store = home / ".ollama" / "models"
    llama = ollama_blob(store, basename="llama-3.2", size_label="3B", seed=1)
    ollama_manifest(
        store,
        "registry.ollama.ai/library/llama3.2/3b",
        llama,
        extra_layers=[{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:1"}],
    )
    ollama_manifest(store, "registry.ollama.ai/library/llama3.2/latest", llama)
    ollama_manifest(store, "registry.ollama.ai/someone/tiny/q8", ollama_blob(store, basename="t", seed=2))
    ollama_manifest(store, "hf.co/org/Repo-GGUF/Q4_K_M", ollama_blob(store, basename="r", seed=3))
    ollama_manifest(store, "registry.ollama.ai/library/ghost/1b", "sha256:" + "ab" * 32, size=12345)
    ollama_manifest(store, "registry.ollama.ai/library/embedonly/v1", "sha256:00")  # rewritten below
    (store / "manifests/registry.ollama.ai/library/embedonly/v1").write_text('{"layers": []}')
    ollama_manifest(store, "registry.ollama.ai/library/garbled/v1", "sha256:00")
    (store / "manifests/registry.ollama.ai/library/garbled/v1").write_text("{not json")
    f["ollama_blob"] = store / "blobs" / llama.replace(":", "-")
    # Hugging Face cache: snapshot links to blobs; a second revision links the same blob; a split model
    hub = home / ".cache" / "huggingface" / "hub"
    src = write_tiny_gguf(tmp / "src" / "hf.gguf", basename="hf-tiny", size_label="1M", file_type=7, seed=4)
    f["hf"] = hf_snapshot_file(hub, "org/tiny-GGUF", "rev1", "tiny-Q8_0.gguf", src)
    hf_snapshot_file(hub, "org/tiny-GGUF", "rev2", "tiny-Q8_0.gguf", src)
    first = write_tiny_gguf(
        tmp / "src" / "split" / "big.gguf",
        basename="hf-split",
        size_label="3M",
        file_type=1,
        split_max_tensors=8,
        seed=5,
    )
    for n in (1, 2, 3):
        part = first.with_name(f"big-{n:05d}-of-00003.gguf")
        f[f"hf_split_{n}"] = hf_snapshot_file(hub, "org/split-GGUF", "rev1", f"F16/{part.name}", part)
    (hub / "models--org--tiny-GGUF" / "snapshots" / "rev1" / "README.md").write_text("# tiny")
    (hub / "datasets--org--data" / "snapshots" / "r").mkdir(parents=True)
    write_tiny_gguf(hub / "datasets--org--data" / "snapshots" / "r" / "not-a-model-repo.gguf")
    # llama.cpp cache (flat names)
    f["cpp"] = write_tiny_gguf(
        home / ".cache" / "llama.cpp" / "org_repo_cpp-tiny-F16.gguf",
        basename="cpp-tiny",
        size_label="1M",
        file_type=1,
        seed=6,
    )
    # custom folder: good, bad and odd files
    good = write_tiny_gguf(tmp / "src" / "good.gguf", seed=7)
    f["bad_magic"] = custom / "bad-magic.gguf"
    f["bad_magic"].parent.mkdir(parents=True)
    f["bad_magic"].write_bytes(bytes(range(256)) * 4)
    f["html"] = custom / "renamed-page.gguf"
    f["html"].write_text("<!DOCTYPE html><html><body>404</body></html>")
    f["truncated"] = cut(good, custom / "truncated.gguf", kv_section_end(good) // 2)
    f["short"] = cut(good, custom / "short-weights.gguf", good.stat().st_size - 4096)
    write_tiny_gguf(custom / "mmproj-tiny-f16.gguf")
    write_header_only(custom / "projector.gguf", arch="clip", kv={"general.type": "mmproj"}, tensors=2)
    write_vocab_only(custom / "ggml-vocab-llama.gguf")
    write_tiny_gguf(custom / "lora.gguf", extra_kv={"general.type": "adapter"})
    f["split"] = write_tiny_gguf(
        custom / "split" / "sm.gguf", basename="split-model", size_label="1M", split_max_tensors=8, seed=8
    )
    broken = write_tiny_gguf(
        custom / "broken" / "bs.gguf", basename="broken-split", size_label="1M", split_max_tensors=8, seed=9
    )
    broken.with_name("bs-00002-of-00003.gguf").unlink()
    f["broken"] = broken
    f["nometa"] = write_tiny_gguf(
        custom / "plain" / "My Model v2 (final).gguf", basename=None, size_label=None, file_type=None, seed=10
    )
    f["dup_a"] = write_tiny_gguf(custom / "a" / "first.gguf", basename="dup", size_label="1M", seed=11)
    f["dup_b"] = write_tiny_gguf(custom / "b" / "second.gguf", basename="dup", size_label="1M", seed=12)
    f["renamed_part"] = write_tiny_gguf(
        tmp / "src" / "rp" / "rp.gguf", basename="lonely", size_label="1M", split_max_tensors=8, seed=13
    )
    os.replace(f["renamed_part"], custom / "lonely.gguf")
    f["renamed_part"] = custom / "lonely.gguf"
    (custom / "loop").symlink_to(custom, target_is_directory=True)  # a symlink loop
    (custom / "notes.txt").write_text("not a model")
    (custom / "downloading.gguf.part").write_bytes(b"GGUF")
    (custom / ".hidden").mkdir()
    write_tiny_gguf(custom / ".hidden" / "secret.gguf")
    (custom / "dangling.gguf").symlink_to(custom / "nowhere.gguf")
    return World(home, paths, custom, f)


@pytest.fixture(scope="module")
def scanned(world: World) -> tuple[Catalog, dict[str, ModelEntry]]:
    catalog = world.catalog()
    return catalog, {e.id: e for e in catalog.scan()}


def test_ids_and_sources(world: World, scanned: tuple[Catalog, dict[str, ModelEntry]]) -> None:
    _, by_id = scanned
    expected = {
        "own:2m-q8_0": "lmsp-tray",
        "tiny-chat:1m-q4_k_m": "lm-studio",
        "old-model.q5_k_m": "lm-studio",
        "llama3.2:3b": "ollama",
        "someone/tiny:q8": "ollama",
        "hf.co/org/Repo-GGUF:Q4_K_M": "ollama",
        "ghost:1b": "ollama",
        "garbled:v1": "ollama",
        "hf-tiny:1m-q8_0": "huggingface",
        "hf-split:3m-f16": "huggingface",
        "cpp-tiny:1m-f16": "llama.cpp",
        "bad-magic": "custom",
        "renamed-page": "custom",
        "tiny-test:1m-f32": "custom",  # short-weights.gguf: its header is whole, so it has its final id
        "split-model:1m-f32": "custom",
        "broken-split:1m-f32": "custom",
        "my-model-v2-final": "custom",
        "dup:1m-f32": "custom",
        f"dup:1m-f32-{_suffix(world.files['dup_b'])}": "custom",
        "lonely:1m-f32": "custom",
    }
    assert {i: e.source for i, e in by_id.items()} == expected


def test_good_models_have_facts_sizes_and_paths(world: World, scanned: tuple[Catalog, dict[str, ModelEntry]]) -> None:
    _, by_id = scanned
    own = by_id["own:2m-q8_0"]
    assert own.ok and own.path == world.files["own"] and own.files == (world.files["own"],)
    assert own.size_bytes == world.files["own"].stat().st_size
    assert own.info is not None and own.info.context_length == 512 and own.info.quantization == "Q8_0"
    legacy = by_id["old-model.q5_k_m"]
    assert legacy.ok and legacy.info and legacy.info.quantization == "Q5_K_M"  # from the file name
    hf = by_id["hf-tiny:1m-q8_0"]
    assert hf.ok and hf.path == world.files["hf"] and hf.path.is_symlink()  # the snapshot name, not the blob


def test_ollama_names_aliases_and_blobs(world: World, scanned: tuple[Catalog, dict[str, ModelEntry]]) -> None:
    catalog, by_id = scanned
    llama = by_id["llama3.2:3b"]
    assert llama.ok and llama.path == world.files["ollama_blob"]
    assert llama.extra["aliases"] == ["llama3.2:latest"]
    assert llama.info and llama.info.basename == "llama-3.2"
    assert catalog.resolve("llama3.2:latest") is llama and catalog.resolve("LLAMA3.2") is llama
    ghost = by_id["ghost:1b"]
    assert ghost.error and "missing its weights file sha256-abab" in ghost.error
    assert "ollama pull ghost:1b" in ghost.error
    assert ghost.size_bytes == 12345 and not ghost.ok
    assert not any("embedonly" in i for i in by_id)
    garbled = by_id["garbled:v1"]
    assert garbled.error and garbled.error.startswith("unreadable Ollama manifest for 'garbled:v1'")
    assert str(world.home) not in garbled.error


def test_split_models_are_one_entry(world: World, scanned: tuple[Catalog, dict[str, ModelEntry]]) -> None:
    _, by_id = scanned
    split = by_id["split-model:1m-f32"]
    parts = tuple(world.files["split"].with_name(f"sm-{n:05d}-of-00003.gguf") for n in (1, 2, 3))
    assert split.ok and split.path == parts[0] and split.files == parts
    assert split.size_bytes == sum(p.stat().st_size for p in parts)
    hf_split = by_id["hf-split:3m-f16"]
    assert hf_split.ok and hf_split.files == tuple(world.files[f"hf_split_{n}"] for n in (1, 2, 3))
    broken = by_id["broken-split:1m-f32"]
    assert broken.error and "bs-00002-of-00003.gguf" in broken.error and "1 of its 3 parts are missing" in broken.error
    assert broken.info is not None  # the header of part 1 was still read
    lonely = by_id["lonely:1m-f32"]
    assert lonely.error and "one of 3 parts of a split model" in lonely.error


def test_bad_files_are_error_entries_and_the_scan_goes_on(
    world: World, scanned: tuple[Catalog, dict[str, ModelEntry]]
) -> None:
    catalog, by_id = scanned
    errors = {i: e.error for i, e in by_id.items() if e.error}
    assert not any(str(world.custom) in m or str(world.home) in m for m in errors.values())  # clients see these
    assert "not a GGUF model file" in errors["bad-magic"] and "the bytes 00 01 02 03" in errors["bad-magic"]
    assert "HTML" in errors["renamed-page"]
    short = by_id["tiny-test:1m-f32"]
    assert short.path.name == "short-weights.gguf" and short.incomplete and short.info is not None
    assert errors["tiny-test:1m-f32"].startswith("incomplete file, probably a download or copy")
    assert "4,096 bytes" in errors["tiny-test:1m-f32"]
    # A file cut inside its header is no model yet: no id (it would change once the header is there).
    [cut] = catalog.incomplete_files()
    assert cut.path.name == "truncated.gguf" and cut.source == "custom"
    assert "truncated" in cut.error and "metadata" in cut.error and cut.error.startswith("incomplete file")
    assert not any(e.path == cut.path for e in by_id.values())
    assert set(errors) == {
        "bad-magic",
        "renamed-page",
        "tiny-test:1m-f32",
        "ghost:1b",
        "garbled:v1",
        "broken-split:1m-f32",
        "lonely:1m-f32",
    }
    assert all(e.info is None for i, e in by_id.items() if i in {"bad-magic", "renamed-page"})
    report = catalog.last_report
    assert report is not None and report.errors == len(errors) and report.models == len(by_id)
    assert report.skipped == {"mmproj": 1, "vocab": 1, "adapter": 1}
    assert report.duplicates == 1  # the second HF revision links the same blob


def test_resolve_and_get(scanned: tuple[Catalog, dict[str, ModelEntry]]) -> None:
    catalog, by_id = scanned
    assert catalog.get("tiny-chat:1m-q4_k_m") is by_id["tiny-chat:1m-q4_k_m"]
    assert catalog.get("TINY-CHAT:1M-Q4_K_M") is None
    assert catalog.resolve("TINY-CHAT:1M-Q4_K_M") is by_id["tiny-chat:1m-q4_k_m"]
    assert catalog.resolve("hf.co/org/repo-gguf:q4_k_m") is by_id["hf.co/org/Repo-GGUF:Q4_K_M"]
    assert catalog.resolve("nope") is None and catalog.get("nope") is None
    assert [e.id for e in catalog.entries()] == sorted(by_id, key=lambda i: (i.lower(), i))


def test_rescan_is_stable_and_uses_the_cache(world: World, scanned: tuple[Catalog, dict[str, ModelEntry]]) -> None:
    catalog, by_id = scanned
    again = catalog.scan()
    assert {e.id: e.path for e in again} == {i: e.path for i, e in by_id.items()}
    report = catalog.last_report
    assert report is not None and report.headers_read == 0 and report.cache_hits > 15
    fresh = world.catalog()  # a new process: the cache file is read back
    assert [e.id for e in fresh.scan()] == [e.id for e in again]
    assert fresh.last_report is not None and fresh.last_report.headers_read == 0
    assert header_cache_file(world.paths).is_file()


def test_corrupt_cache_is_ignored_and_changed_files_are_reread(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_tiny_gguf(folder / "a.gguf", basename="a", size_label="1M")
    write_tiny_gguf(folder / "b.gguf", basename="b", size_label="1M")
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")
    config = Config(models_dirs=[folder], default_dirs=False)
    first = Catalog.from_config(paths, config)
    assert [e.id for e in first.scan()] == ["a:1m-f32", "b:1m-f32"]
    header_cache_file(paths).write_text("{definitely not json")
    second = Catalog.from_config(paths, config)
    assert [e.id for e in second.scan()] == ["a:1m-f32", "b:1m-f32"]
    assert second.last_report is not None and second.last_report.headers_read == 2
    write_tiny_gguf(folder / "b.gguf", basename="b", size_label="7M", seed=3)  # replaced in place
    os.utime(folder / "b.gguf", ns=(1, 1))
    assert [e.id for e in second.scan()] == ["a:1m-f32", "b:7m-f32"]
    assert second.last_report is not None and second.last_report.headers_read == 1
    (folder / "a.gguf").unlink()
    assert [e.id for e in second.scan()] == ["b:7m-f32"]


def test_clashing_ids_are_deterministic_and_stable(tmp_path: Path) -> None:
    lms = tmp_path / "home" / ".lmstudio" / "models"
    own_dir = tmp_path / "custom"
    a = write_tiny_gguf(lms / "pub" / "r" / "x.gguf", basename="same", size_label="1M", seed=1)
    b = write_tiny_gguf(own_dir / "z" / "y.gguf", basename="same", size_label="1M", seed=2)
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")

    def ids() -> dict[str, Path]:
        catalog = Catalog.from_config(
            paths, Config(models_dirs=[own_dir]), environ={}, home=tmp_path / "home", include_system=False
        )
        return {e.id: e.path for e in catalog.scan()}

    first = ids()
    # custom folders rank before LM Studio: the custom file keeps the plain id
    assert first == {"same:1m-f32": b, f"same:1m-f32-{_suffix(a)}": a}
    # a third file that ranks after the holder of the plain id changes no existing id
    c = write_tiny_gguf(own_dir / "zz" / "v.gguf", basename="same", size_label="1M", seed=3)
    second = ids()
    assert second == {"same:1m-f32": b, f"same:1m-f32-{_suffix(a)}": a, f"same:1m-f32-{_suffix(c)}": c}
    assert ids() == second
    # one that ranks first (same family, earlier path) takes the plain id; the others keep their suffixes
    d = write_tiny_gguf(own_dir / "a" / "u.gguf", basename="same", size_label="1M", seed=4)
    third = ids()
    assert third == {
        "same:1m-f32": d,
        f"same:1m-f32-{_suffix(b)}": b,
        f"same:1m-f32-{_suffix(a)}": a,
        f"same:1m-f32-{_suffix(c)}": c,
    }


def test_duplicate_folders_list_each_file_once(world: World) -> None:
    catalog = Catalog.from_config(
        world.paths,
        Config(models_dirs=[world.home / ".lmstudio" / "models"]),
        environ={},
        home=world.home,
        include_system=False,
    )
    entries = [e for e in catalog.scan() if e.path == world.files["lms"]]
    assert [(e.id, e.source) for e in entries] == [("tiny-chat:1m-q4_k_m", "custom")]


def test_no_default_dirs_scans_only_the_custom_folders(world: World) -> None:
    catalog = world.catalog(default_dirs=False)
    assert {e.source for e in catalog.entries()} == {"custom"}  # entries() scans on first use
    assert catalog.sources[0].root == world.custom and len(catalog.sources) == 1


def test_missing_folders_are_fine(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")
    catalog = Catalog.from_config(
        paths, Config(models_dirs=[tmp_path / "absent"]), environ={}, home=tmp_path / "nohome", include_system=False
    )
    assert catalog.scan() == [] and catalog.entries() == []


def test_concurrent_scans_and_reads(world: World) -> None:
    catalog = world.catalog()
    expected = [e.id for e in catalog.scan()]
    problems: list[BaseException] = []
    seen: list[list[str]] = []

    def work(n: int) -> None:
        try:
            for _ in range(3):
                if n % 2:
                    seen.append([e.id for e in catalog.scan()])
                else:
                    seen.append([e.id for e in catalog.entries()])
                    assert catalog.resolve("llama3.2") is not None
        except BaseException as exc:  # noqa: BLE001 - reported below
            problems.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems and len(seen) == 12 and all(s == expected for s in seen)


def test_an_unexpected_reader_failure_costs_one_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmsp_tray.discovery import scan

    folder = tmp_path / "models"
    write_tiny_gguf(folder / "fine.gguf", basename="fine", size_label="1M")
    doomed = write_tiny_gguf(folder / "doomed.gguf", basename="doomed", size_label="1M")
    real = scan.read_gguf_info

    def flaky(path: os.PathLike[str]) -> object:
        if Path(path) == doomed:
            raise RuntimeError("a bug")
        return real(path)

    monkeypatch.setattr(scan, "read_gguf_info", flaky)
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")
    catalog = Catalog.from_config(paths, Config(models_dirs=[folder], default_dirs=False))
    by_id = {e.id: e for e in catalog.scan()}
    assert by_id["fine:1m-f32"].ok
    assert by_id["doomed"].error == "could not read the GGUF header (RuntimeError)"
    monkeypatch.setattr(scan, "read_gguf_info", real)  # not cached: the next scan reads it again
    assert Catalog.from_config(paths, Config(models_dirs=[folder], default_dirs=False)).get("doomed:1m-f32")


def test_a_file_being_copied_keeps_one_id_and_is_no_model_until_its_header_is_there(tmp_path: Path) -> None:
    """A copy seen at every stage (as a folder watcher sees it): empty, header cut short, weights cut
    short, complete. It never appears under a name it would lose: first it is an incomplete file
    with no id at all, then (header whole) under the id it keeps once complete."""
    source = write_tiny_gguf(tmp_path / "src" / "gemma-like.gguf", basename="gemma-3", size_label="270M", file_type=15)
    data = source.read_bytes()
    folder = tmp_path / "models"
    folder.mkdir()
    target = folder / "slow-copy.gguf"
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")
    catalog = Catalog.from_config(
        paths, Config(models_dirs=[folder], default_dirs=False), environ={}, home=tmp_path, include_system=False
    )
    header_end = kv_section_end(source)
    seen: list[tuple[list[str], list[str]]] = []
    for length in (0, 64, header_end // 2, header_end + 16, len(data) // 2, len(data) - 1, len(data)):
        target.write_bytes(data[:length])
        entries = catalog.scan()
        seen.append(([e.id for e in entries], [f.path.name for f in catalog.incomplete_files()]))
    final = "gemma-3:270m-q4_k_m"
    assert seen[:3] == [([], ["slow-copy.gguf"])] * 3  # empty, cut inside the header: no model, no id
    ids = {entry_ids[0] for entry_ids, _ in seen[4:]}
    assert ids == {final}  # weights still missing, then complete: always the same id
    assert all(not incomplete for _, incomplete in seen[4:])
    [entry] = catalog.entries()
    assert entry.ok and entry.path == target and not entry.incomplete


def test_a_rescan_that_finds_the_same_is_not_logged_as_news(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "models"
    write_tiny_gguf(folder / "a.gguf")
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "cache", tmp_path / "r")
    catalog = Catalog.from_config(
        paths, Config(models_dirs=[folder], default_dirs=False), environ={}, home=tmp_path, include_system=False
    )
    caplog.set_level("INFO", logger="lmsp_tray.discovery.catalog")
    for _ in range(3):
        catalog.scan()
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "discovery: 1 models (0 with errors, 0 incomplete files)"
    ]
    write_tiny_gguf(folder / "b.gguf", basename="b", size_label="1M", seed=4)
    catalog.scan()
    assert len(caplog.records) == 2 and "discovery: 2 models" in caplog.records[-1].getMessage()
