"""Where models live: the folder families lmsp-tray scans, per OS, with env overrides.

Users already keep GGUF files somewhere: LM Studio's models folder, Ollama's
store, the Hugging Face hub cache, llama.cpp's download cache, a folder of
their own. This module only *names* those places (a `Source` per folder,
tagged with its family); `scan` walks them. Nothing here touches the disk
except reading LM Studio's two small pointer/settings files, and everything
that depends on the machine (environment, home folder, platform) is a
parameter, so tests can lay out a fake home.

Families and their names in `ModelEntry.source`:

- ``lmsp-tray``: the service's own folder (`Paths.models_dir`).
- ``custom``: folders from config.toml ``models_dirs`` and ``--models-dir``.
- ``lm-studio``: ``downloadsFolder`` from ``~/.lmstudio/settings.json`` (if
  set), ``<lmstudio home>/models`` (the home is ``~/.lmstudio``, or the folder
  named in ``~/.lmstudio-home-pointer``) and the legacy
  ``~/.cache/lm-studio/models``; the same on every OS.
- ``ollama``: ``$OLLAMA_MODELS``, ``~/.ollama/models`` and, on Linux, the
  system service's store ``/usr/share/ollama/.ollama/models``.
- ``huggingface``: ``$HF_HUB_CACHE`` (or legacy ``$HUGGINGFACE_HUB_CACHE``),
  else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
  ``~/.cache/huggingface/hub`` (as huggingface_hub resolves it).
- ``llama.cpp``: ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp`` (Linux), ``~/Library/Caches/llama.cpp`` (macOS),
  ``%LOCALAPPDATA%/llama.cpp`` (Windows).

`Config.default_dirs` (``--no-default-dirs`` sets it false) decides whether
any of the built-in places are scanned: when false, *only* the custom
folders are, not even the service's own folder ("scan only those").
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lmsp_tray.config import Config, Paths

OWN = "lmsp-tray"
CUSTOM = "custom"
LM_STUDIO = "lm-studio"
OLLAMA = "ollama"
HUGGINGFACE = "huggingface"
LLAMA_CPP = "llama.cpp"
FAMILIES = (OWN, CUSTOM, LM_STUDIO, OLLAMA, HUGGINGFACE, LLAMA_CPP)  # also the precedence order

LINUX_OLLAMA_SYSTEM_STORE = Path("/usr/share/ollama/.ollama/models")


@dataclass(frozen=True)
class Source:
    """One folder to scan, and the family it belongs to."""

    name: str  # one of FAMILIES; becomes ModelEntry.source
    root: Path
    layout: str = "folder"  # "folder" (recursive *.gguf) | "ollama" (manifests + blobs) | "huggingface"

    @property
    def rank(self) -> int:
        """Precedence of the family (lower wins a duplicate file or a clashing id)."""
        return FAMILIES.index(self.name) if self.name in FAMILIES else len(FAMILIES)

    def exists(self) -> bool:
        try:
            return self.root.is_dir()
        except OSError:
            return False


def default_sources(
    paths: Paths,
    config: Config,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    *,
    platform: str | None = None,
    include_system: bool = True,
) -> list[Source]:
    """Every folder to scan for this user, in precedence order, without duplicates.

    Folders that do not exist are still listed (a later watcher may wait for
    them); the scan skips them. `include_system=False` leaves out stores
    outside the user's home (Ollama's Linux system store), for tests.
    """
    env = os.environ if environ is None else environ
    home = Path.home() if home is None else Path(home)
    platform = sys.platform if platform is None else platform
    out: list[Source] = []
    if config.default_dirs:
        out.append(Source(OWN, paths.models_dir))
    out.extend(Source(CUSTOM, _absolute(p)) for p in config.models_dirs)
    if config.default_dirs:
        out.extend(Source(LM_STUDIO, p) for p in lm_studio_dirs(env, home))
        out.extend(Source(OLLAMA, p, "ollama") for p in ollama_dirs(env, home, platform, include_system))
        out.append(Source(HUGGINGFACE, huggingface_hub_dir(env, home), "huggingface"))
        out.append(Source(LLAMA_CPP, llama_cpp_cache_dir(env, home, platform)))
    return _unique(out)


def with_cli_dirs(config: Config, models_dirs: Iterable[str | Path] = (), no_default_dirs: bool = False) -> Config:
    """The config after ``--models-dir`` (repeatable) and ``--no-default-dirs``.

    Command-line folders are added after the config file's (relative ones
    resolved against the current directory); ``--no-default-dirs`` turns the
    built-in places off, so only these custom folders are scanned.
    """
    extra = [Path(p).expanduser().resolve() for p in models_dirs]
    dirs = list(config.models_dirs)
    dirs += [p for p in extra if p not in dirs]
    return dataclasses.replace(config, models_dirs=dirs, default_dirs=config.default_dirs and not no_default_dirs)


def lm_studio_dirs(environ: Mapping[str, str], home: Path) -> list[Path]:
    """LM Studio's models folders: the configured one, the default and the legacy one."""
    lms_home = home / ".lmstudio"
    pointer = home / ".lmstudio-home-pointer"
    try:
        pointed = pointer.read_text(encoding="utf-8").strip()
        if pointed:
            lms_home = Path(pointed).expanduser()
    except (OSError, UnicodeDecodeError):
        pass
    out: list[Path] = []
    for settings in (lms_home / "settings.json", home / ".lmstudio" / "settings.json"):
        folder = _json_string(settings, "downloadsFolder")
        if folder:
            out.append(Path(folder).expanduser())
    out += [lms_home / "models", home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    return _unique_paths(out)


def ollama_dirs(environ: Mapping[str, str], home: Path, platform: str, include_system: bool = True) -> list[Path]:
    """Ollama stores (each holds ``manifests/`` and ``blobs/``)."""
    out: list[Path] = []
    if environ.get("OLLAMA_MODELS"):
        out.append(Path(environ["OLLAMA_MODELS"]).expanduser())
    out.append(home / ".ollama" / "models")
    if include_system and platform.startswith("linux"):
        out.append(LINUX_OLLAMA_SYSTEM_STORE)
    return _unique_paths(out)


def huggingface_hub_dir(environ: Mapping[str, str], home: Path) -> Path:
    """The Hugging Face hub cache (``models--org--name/snapshots/<rev>/...``)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(var):
            return Path(environ[var]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return home / ".cache" / "huggingface" / "hub"


def llama_cpp_cache_dir(environ: Mapping[str, str], home: Path, platform: str) -> Path:
    """Where ``llama-cli -hf``/``llama-server -hf`` download models."""
    if environ.get("LLAMA_CACHE"):
        return Path(environ["LLAMA_CACHE"]).expanduser()
    if platform == "darwin":
        return home / "Library" / "Caches" / "llama.cpp"
    if platform.startswith("win"):
        local = environ.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "llama.cpp"
    cache = environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else home / ".cache") / "llama.cpp"


def _json_string(path: Path, key: str) -> str | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value.strip() else None


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


def _key(path: Path) -> str:
    return os.path.normcase(os.path.abspath(path))


def _unique_paths(paths: list[Path]) -> list[Path]:
    seen: set[str] = set()
    out = []
    for p in paths:
        if _key(p) not in seen:
            seen.add(_key(p))
            out.append(p)
    return out


def _unique(sources: list[Source]) -> list[Source]:
    """Drop a folder named twice (the first, higher-precedence mention wins)."""
    seen: set[str] = set()
    out = []
    for s in sources:
        if _key(s.root) not in seen:
            seen.add(_key(s.root))
            out.append(s)
    return out
