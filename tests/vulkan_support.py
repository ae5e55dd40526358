"""Tests marked `vulkan` run on llama.cpp's Vulkan backend: only in a venv whose llama-cpp-python was built
with GGML_VULKAN (.ci/run makes .venv-vulkan with `LMSP_BACKEND=vulkan python3 installers/install.py`) and
with a Vulkan device — lavapipe, Mesa's CPU implementation, where there is no GPU. Elsewhere they are
skipped, saying so; with LMSP_REQUIRE_VULKAN=1 (.ci/run's Vulkan run) they run, and fail if the build or
the device is missing. llama.cpp's Vulkan backend skips CPU-type devices unless GGML_VK_VISIBLE_DEVICES
names them: it is set to 0 (the first device) unless given.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SKIP_REASON = (
    "needs llama-cpp-python built with GGML_VULKAN (this venv's is not): .ci/run runs these in .venv-vulkan, "
    "made by `LMSP_BACKEND=vulkan python3 installers/install.py --venv .venv-vulkan --extras test`"
)


def llama_lib_dir() -> Path | None:
    """The `llama_cpp` package's lib folder, found without importing the package."""
    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent / "lib" if spec is not None and spec.origin else None


def vulkan_build() -> bool:
    """Whether the installed llama.cpp has the Vulkan backend (its libggml-vulkan library)."""
    lib = llama_lib_dir()
    return lib is not None and any(lib.glob("libggml-vulkan.*"))


def mark_vulkan_tests(items: list[pytest.Item]) -> None:
    """Skip the `vulkan` tests where they cannot run, unless LMSP_REQUIRE_VULKAN says they must."""
    marked = [item for item in items if item.get_closest_marker("vulkan") is not None]
    if not marked:
        return
    if vulkan_build() or os.environ.get("LMSP_REQUIRE_VULKAN") == "1":
        os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")  # lavapipe is a CPU-type device
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
