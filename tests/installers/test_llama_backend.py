"""The installer's llama.cpp backend choice as a function of what the machine has: a fake root (its /dev,
/proc, loader and driver manifests), a fake PATH (nvcc, nvidia-smi, vulkaninfo as scripts), no build."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

INSTALLERS = Path(__file__).resolve().parents[2] / "installers"
sys.path.insert(0, str(INSTALLERS))  # a script folder, not a package: it runs before the venv exists

import llama_backend
from llama_backend import BackendChoiceError, choose, gather

LAVAPIPE_SUMMARY = """Devices:
========
GPU0:
\tapiVersion         = 1.3.230
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""
RADEON_SUMMARY = """Devices:
========
GPU0:
\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName         = AMD Radeon RX 7600 (RADV NAVI33)
GPU1:
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""


class Box:
    """A fake machine: files under `root`, tools in `bin`."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.bin = tmp / "bin"
        self.root.mkdir()
        self.bin.mkdir()

    def file(self, rel: str, text: str = "") -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def tool(self, name: str, stdout: str = "", code: int = 0) -> None:
        script = self.bin / name
        script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nexit {code}\n")
        script.chmod(0o755)

    def nvidia_driver(self) -> None:
        self.file("dev/nvidia0")
        self.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54")

    def vulkan_loader(self) -> None:
        self.file("usr/lib/x86_64-linux-gnu/libvulkan.so.1")

    def mesa(self, render_node: bool) -> None:
        for icd in ("radeon_icd.x86_64.json", "intel_icd.x86_64.json", "lvp_icd.x86_64.json"):
            self.file(f"usr/share/vulkan/icd.d/{icd}", "{}")
        if render_node:
            self.file("dev/dri/renderD128")

    def choice(self, env: dict[str, str] | None = None, system: str = "Linux", arch: str = "x86_64"):
        machine = gather(self.root, path=str(self.bin), env=env or {}, system=system, arch=arch)
        return choose(machine, env or {})


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def test_nothing_at_all_is_the_cpu(box):
    choice = box.choice()
    assert (choice.backend, choice.cmake_args, choice.forced) == ("cpu", "", False)
    assert "no NVIDIA driver, no Vulkan driver for a GPU" in choice.reason


def test_an_nvidia_driver_with_the_cuda_toolkit_is_cuda(box):
    box.nvidia_driver()
    box.tool("nvcc")
    box.vulkan_loader()
    choice = box.choice()
    assert (choice.backend, choice.cmake_args) == ("cuda", "-DGGML_CUDA=on")
    assert "/proc/driver/nvidia/version" in choice.reason and "nvcc" in choice.reason


def test_the_toolkit_under_usr_local_cuda_counts(box):
    box.nvidia_driver()
    box.file("usr/local/cuda/bin/nvcc")
    assert box.choice().backend == "cuda"


def test_an_nvidia_driver_without_the_toolkit_is_vulkan_through_its_vulkan_driver(box):
    box.nvidia_driver()
    box.vulkan_loader()
    box.file("usr/share/vulkan/icd.d/nvidia_icd.json", "{}")
    choice = box.choice()
    assert (choice.backend, choice.cmake_args) == ("vulkan", "-DGGML_VULKAN=on")
    assert "nvidia_icd.json with /dev/nvidia0" in choice.reason and "without the CUDA toolkit" in choice.reason


def test_an_nvidia_driver_without_toolkit_or_loader_is_the_cpu_saying_what_to_install(box):
    box.nvidia_driver()
    choice = box.choice()
    assert choice.backend == "cpu"
    assert "neither the CUDA toolkit (nvcc) nor a Vulkan loader" in choice.reason


def test_mesa_with_a_render_node_and_the_loader_is_vulkan(box):
    box.vulkan_loader()
    box.mesa(render_node=True)
    choice = box.choice()
    assert choice.backend == "vulkan"
    assert "/dev/dri/renderD128" in choice.reason and "lvp_icd" not in choice.reason


def test_mesa_without_a_gpu_device_node_is_the_cpu(box):
    """A container or a server with Mesa installed but no GPU: the drivers are there, no device is."""
    box.vulkan_loader()
    box.mesa(render_node=False)
    assert box.choice().backend == "cpu"


def test_a_gpu_without_the_vulkan_loader_is_the_cpu_naming_the_package(box):
    box.mesa(render_node=True)
    choice = box.choice()
    assert choice.backend == "cpu" and "install libvulkan1" in choice.reason


def test_vulkaninfo_decides_when_it_answers_lavapipe_alone_is_not_a_gpu(box):
    """vulkaninfo lists lavapipe (PHYSICAL_DEVICE_TYPE_CPU): a Vulkan device, but the CPU build is as fast."""
    box.vulkan_loader()
    box.mesa(render_node=True)  # a render node would say GPU; vulkaninfo's answer wins
    box.tool("vulkaninfo", LAVAPIPE_SUMMARY)
    choice = box.choice()
    assert choice.backend == "cpu" and "only a CPU Vulkan device (llvmpipe" in choice.reason


def test_vulkaninfo_with_a_discrete_gpu_is_vulkan(box):
    box.vulkan_loader()
    box.tool("vulkaninfo", RADEON_SUMMARY)
    choice = box.choice()
    assert choice.backend == "vulkan" and "AMD Radeon RX 7600 (RADV NAVI33) (DISCRETE_GPU)" in choice.reason


def test_a_failing_vulkaninfo_falls_back_to_the_manifests(box):
    box.vulkan_loader()
    box.mesa(render_node=True)
    box.tool("vulkaninfo", "", code=1)
    assert box.choice().backend == "vulkan"


def test_macos_on_apple_silicon_is_metal_and_on_intel_the_cpu_with_metal_off(box):
    assert box.choice(system="Darwin", arch="arm64").backend == "metal"
    intel = box.choice(system="Darwin", arch="x86_64")
    assert (intel.backend, intel.cmake_args) == ("cpu", "-DGGML_METAL=off")


def test_lmsp_backend_forces_any_backend(box):
    box.nvidia_driver()
    box.tool("nvcc")
    for name in ("cpu", "vulkan", "metal", "cuda"):
        choice = box.choice({"LMSP_BACKEND": name.upper()})
        assert (choice.backend, choice.cmake_args, choice.forced) == (name, llama_backend.CMAKE_ARGS[name], True)
        assert f"LMSP_BACKEND={name}" in choice.reason


def test_an_unknown_lmsp_backend_is_refused(box):
    with pytest.raises(BackendChoiceError, match="rocm"):
        box.choice({"LMSP_BACKEND": "rocm"})


def test_the_persons_cmake_args_are_used_as_given_and_name_the_backend(box):
    box.vulkan_loader()
    box.mesa(render_node=True)
    given = "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89"
    choice = box.choice({"CMAKE_ARGS": given})
    assert (choice.backend, choice.cmake_args, choice.forced) == ("cuda", given, True)
    assert box.choice({"CMAKE_ARGS": "-DGGML_NATIVE=off"}).backend == "cpu"
    extra = box.choice({"CMAKE_ARGS": "-DGGML_NATIVE=off", "LMSP_BACKEND": "vulkan"})
    assert (extra.backend, extra.cmake_args) == ("vulkan", "-DGGML_VULKAN=on -DGGML_NATIVE=off")
    with pytest.raises(BackendChoiceError, match="build hip"):
        box.choice({"CMAKE_ARGS": "-DGGML_HIP=on", "LMSP_BACKEND": "vulkan"})


def test_this_machine_gives_an_answer():
    """The real machine, read for real: some backend, with a reason."""
    choice = choose(gather(), {})
    assert choice.backend in llama_backend.BACKENDS and choice.reason
