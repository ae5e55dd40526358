"""The installer's wheel cache per backend and its CPU fallback, with a stand-in for `python -m pip wheel`
(a script that builds a fake wheel, or fails like the Vulkan build does on old headers): no real build."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

INSTALLERS = Path(__file__).resolve().parents[2] / "installers"
sys.path.insert(0, str(INSTALLERS))  # a script folder, not a package: it runs before the venv exists

import install
from llama_backend import Choice
from llama_wheel import WheelBuildError, cache_folder, cached_wheel, header_version, obtain

# Stands in for the venv's python: `-m pip wheel ... -w DIR` writes a wheel named by CMAKE_ARGS into DIR,
# or fails when the arguments ask for Vulkan and FAIL_VULKAN is set; every call is logged in CALLS.
FAKE_PYTHON = """#!/bin/sh
echo "$CMAKE_ARGS" >> "$CALLS"
case "$CMAKE_ARGS" in *GGML_VULKAN=on*) if [ -n "$FAIL_VULKAN" ]; then
  echo "ggml-vulkan.cpp:1234: error: 'LayerSettingEXT' is not a member of 'vk'"; exit 1; fi ;; esac
while [ $# -gt 0 ]; do [ "$1" = -w ] && out=$2; shift; done
echo "$CMAKE_ARGS" > "$out/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
"""
VULKAN = Choice("vulkan", "-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=/opt/vk/include", "test")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "LMSP_WHEEL_CACHE": str(tmp_path / "wheels"), "CALLS": str(tmp_path / "calls")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {"python": str(python), **env}


def calls(fake: dict[str, str]) -> list[str]:
    path = Path(fake["CALLS"])
    return path.read_text().splitlines() if path.exists() else []


def test_each_backend_has_its_own_folder_and_custom_args_their_own(tmp_path):
    root = tmp_path / "wheels"
    assert cache_folder(root, Choice("cpu", "", ""), "Linux") == root / "cpu"
    assert cache_folder(root, Choice("vulkan", "-DGGML_VULKAN=on", ""), "Linux") == root / "vulkan"
    custom = cache_folder(root, Choice("cuda", "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89", ""), "Linux")
    assert custom.parent == root and custom.name.startswith("cuda-") and custom != root / "cuda"


def test_a_wheel_is_built_once_per_backend_and_never_handed_to_another(fake, tmp_path):
    log = tmp_path / "build.log"
    cpu = obtain(fake["python"], Choice("cpu", "", ""), "0.3.36", fake, "Linux", log, print)
    assert cpu.built and cpu.path.parent == tmp_path / "wheels" / "cpu"
    again = obtain(fake["python"], Choice("cpu", "", ""), "0.3.36", fake, "Linux", log, print)
    assert (again.built, again.path) == (False, cpu.path)
    vulkan = obtain(fake["python"], VULKAN, "0.3.36", fake, "Linux", log, print)
    assert vulkan.built and vulkan.path.parent.name.startswith("vulkan")  # not the CPU wheel from the cache
    assert "GGML_VULKAN=on" in vulkan.path.read_text() and "GGML_VULKAN" not in cpu.path.read_text()
    assert calls(fake) == ["", VULKAN.cmake_args]  # two builds, the second CPU request took the cache


def test_a_failed_build_leaves_nothing_in_the_cache(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_VULKAN", "1")
    fake["FAIL_VULKAN"] = "1"
    with pytest.raises(WheelBuildError, match="LayerSettingEXT"):
        obtain(fake["python"], VULKAN, "0.3.36", fake, "Linux", tmp_path / "build.log", print)
    assert not list((tmp_path / "wheels").rglob("*.whl"))
    assert not list((tmp_path / "wheels").rglob(".building-*"))


def test_a_failed_gpu_build_falls_back_to_the_cpu_build_and_says_why(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAIL_VULKAN", "1")
    wheel = install.wheel_for(fake["python"], VULKAN, "0.3.36", tmp_path / "vulkan.log")
    assert wheel.backend == "cpu" and wheel.path.parent == tmp_path / "wheels" / "cpu"
    said = capsys.readouterr().out
    assert "the vulkan build failed" in said and "LayerSettingEXT" in said and "building for the CPU instead" in said
    assert calls(fake) == [VULKAN.cmake_args, ""]


def test_a_strict_install_does_not_fall_back(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_VULKAN", "1")
    with pytest.raises(WheelBuildError):
        install.wheel_for(fake["python"], VULKAN, "0.3.36", tmp_path / "vulkan.log", fallback=False)
    assert cached_wheel(tmp_path / "wheels" / "cpu", "0.3.36") is None


@pytest.mark.parametrize(
    ("complete", "patch", "version"),
    [("1, 3", 239, (1, 3, 239)), ("1, 3", 261, (1, 3, 261)), ("1, 4", 309, (1, 4, 309))],
)
def test_the_vulkan_header_version_is_read_from_vulkan_core_h(tmp_path, complete, patch, version):
    header = tmp_path / "vulkan_core.h"
    header.write_text(
        f"#define VK_HEADER_VERSION {patch}\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, {complete}, VK_HEADER_VERSION)\n"
    )
    assert header_version(header) == version
    assert (header_version(header) >= (1, 3, 261)) == (version >= (1, 3, 261))
    assert header_version(tmp_path / "absent.h") is None


def test_the_pinned_llama_cpp_python_is_the_one_built():
    assert install.pinned_version(INSTALLERS.parent / "pyproject.toml") == "0.3.36"
