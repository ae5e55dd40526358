"""Which llama.cpp backend this machine can run, decided before anything is installed.

llama-cpp-python compiles llama.cpp when pip installs it, and what it compiles is decided by
CMAKE_ARGS alone: without them a machine with a GPU gets a CPU build, 10-50x slower, and no message.
This module looks at what the machine has and names the backend to build, with the CMake arguments
and the reason in words:

- an NVIDIA driver and the CUDA toolkit (nvcc) -> cuda;
- a Vulkan loader and a Vulkan driver for a GPU (NVIDIA, AMD, Intel; no toolkit needed) -> vulkan;
- macOS on Apple silicon -> metal (llama.cpp's default there);
- nothing of these -> cpu.

`LMSP_BACKEND=cpu|vulkan|cuda|metal` forces a backend; CMAKE_ARGS given by the person are used as they
are (llama-cpp-python's documented way), the backend then read from them. `gather` reads the machine
(a root folder, a PATH: tests give fake ones), `choose` is a pure function of what it found.
Standard library only: it runs before the virtual environment exists.

Run it alone to see the choice: `python3 installers/llama_backend.py`.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("cpu", "vulkan", "cuda", "metal")

# The CMake arguments that build each backend (llama.cpp's GGML_* options).
CMAKE_ARGS = {
    "cpu": "",
    "vulkan": "-DGGML_VULKAN=on",
    "cuda": "-DGGML_CUDA=on",
    "metal": "-DGGML_METAL=on",
}

# Vulkan device types (vulkaninfo --summary) that are a GPU; lavapipe/llvmpipe is PHYSICAL_DEVICE_TYPE_CPU.
GPU_DEVICE_TYPES = ("DISCRETE_GPU", "INTEGRATED_GPU", "VIRTUAL_GPU")

# Where Linux distributions keep the Vulkan loader and the drivers' manifests (relative to the root).
LOADER_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib")
ICD_DIRS = ("usr/share/vulkan/icd.d", "etc/vulkan/icd.d", "usr/local/share/vulkan/icd.d")
# Mesa's CPU implementation: a Vulkan driver, but not a GPU.
CPU_ICDS = ("lvp_icd",)


@dataclass(frozen=True)
class Machine:
    """What `gather` found; each field names its evidence (a path, a device) or is None."""

    system: str  # platform.system(): Linux, Darwin, Windows
    arch: str  # platform.machine(): x86_64, arm64, aarch64, AMD64
    nvidia_driver: str | None
    cuda_toolkit: str | None  # nvcc
    vulkan_loader: str | None  # libvulkan.so.1 / vulkan-1.dll
    vulkan_gpu: str | None  # a GPU-type Vulkan device, or a GPU driver with its device node
    vulkan_cpu_only: str | None  # only a CPU-type Vulkan device (lavapipe) was seen


@dataclass(frozen=True)
class Choice:
    """The backend to build, the CMake arguments that build it, and why (one sentence for the person)."""

    backend: str
    cmake_args: str
    reason: str
    forced: bool = False  # LMSP_BACKEND or CMAKE_ARGS decided it, not the machine


class BackendChoiceError(ValueError):
    """LMSP_BACKEND names no backend this installer knows."""


def backend_of_cmake_args(args: str) -> str:
    """The backend CMake arguments build: the first GGML_<BACKEND>=on among llama.cpp's GPU options."""
    for name, value in re.findall(r"-DGGML_([A-Z]+)=(\S+)", args):
        if value.lower() in ("on", "1", "true", "yes") and name in ("CUDA", "VULKAN", "METAL", "HIP", "SYCL", "MUSA"):
            return name.lower()
    return "cpu"


def default_cmake_args(backend: str, system: str) -> str:
    """CMAKE_ARGS for a backend; a CPU build on macOS turns Metal off (llama.cpp's default there is on)."""
    if backend == "cpu" and system == "Darwin":
        return "-DGGML_METAL=off"
    return CMAKE_ARGS[backend]


def choose(machine: Machine, env: Mapping[str, str]) -> Choice:
    """The backend for this machine: LMSP_BACKEND, then CMAKE_ARGS, then CUDA, Vulkan, Metal, CPU."""
    given_args = env.get("CMAKE_ARGS", "").strip()
    forced = env.get("LMSP_BACKEND", "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise BackendChoiceError(f"LMSP_BACKEND={forced!r}: choose one of {', '.join(BACKENDS)}")
        named = backend_of_cmake_args(given_args)
        if named not in ("cpu", forced):
            raise BackendChoiceError(f"LMSP_BACKEND={forced} but CMAKE_ARGS={given_args!r} build {named}")
        own = default_cmake_args(forced, machine.system)
        args = given_args if named == forced else f"{own} {given_args}".strip()
        return Choice(forced, args, f"LMSP_BACKEND={forced} asked for it", forced=True)
    if given_args:
        backend = backend_of_cmake_args(given_args)
        return Choice(backend, given_args, f"CMAKE_ARGS={given_args!r} given", forced=True)
    if machine.system == "Darwin":
        if machine.arch in ("arm64", "aarch64"):
            return Choice("metal", "", "macOS on Apple silicon: Metal, llama.cpp's default there")
        return Choice("cpu", default_cmake_args("cpu", "Darwin"), "macOS on an Intel Mac: the CPU")
    if machine.nvidia_driver and machine.cuda_toolkit:
        why = f"an NVIDIA driver ({machine.nvidia_driver}) and the CUDA toolkit ({machine.cuda_toolkit})"
        return Choice("cuda", CMAKE_ARGS["cuda"], why)
    if machine.vulkan_loader and machine.vulkan_gpu:
        why = f"a Vulkan loader ({machine.vulkan_loader}) and a GPU driver ({machine.vulkan_gpu})"
        if machine.nvidia_driver:
            why += "; NVIDIA without the CUDA toolkit builds Vulkan (install nvcc for a CUDA build)"
        return Choice("vulkan", CMAKE_ARGS["vulkan"], why)
    return Choice("cpu", default_cmake_args("cpu", machine.system), "no GPU found: " + cpu_reason(machine))


def cpu_reason(machine: Machine) -> str:
    """Why nothing but the CPU was chosen, with what would change that."""
    if machine.nvidia_driver:
        return (
            f"an NVIDIA driver ({machine.nvidia_driver}) but neither the CUDA toolkit (nvcc) nor a Vulkan loader"
            " (install nvidia-cuda-toolkit, or libvulkan1)"
        )
    if machine.vulkan_gpu:
        return f"a GPU ({machine.vulkan_gpu}) but no Vulkan loader (install libvulkan1)"
    if machine.vulkan_cpu_only:
        return f"only a CPU Vulkan device ({machine.vulkan_cpu_only}), which is no faster than the CPU build"
    return "no NVIDIA driver, no Vulkan driver for a GPU"


def gather(
    root: Path = Path("/"),
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    system: str | None = None,
    arch: str | None = None,
    run: Callable[[list[str]], str | None] | None = None,
) -> Machine:
    """What this machine has, read under `root` and on `path` (the real ones by default)."""
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath) if path is None else path
    system = system or platform.system()
    arch = arch or platform.machine()
    run = run or run_quietly
    vulkan_gpu, vulkan_cpu_only = vulkan_devices(root, path, run)
    return Machine(
        system=system,
        arch=arch,
        nvidia_driver=nvidia_driver(root, path, system),
        cuda_toolkit=cuda_toolkit(root, path, env),
        vulkan_loader=vulkan_loader(root, env, system),
        vulkan_gpu=vulkan_gpu,
        vulkan_cpu_only=vulkan_cpu_only,
    )


def run_quietly(argv: list[str]) -> str | None:
    """A tool's stdout, or None when it fails, hangs or is missing."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def first_existing(root: Path, candidates: tuple[str, ...]) -> str | None:
    for rel in candidates:
        if (root / rel).exists():
            return "/" + rel
    return None


def nvidia_driver(root: Path, path: str, system: str) -> str | None:
    if system == "Linux":
        return first_existing(root, ("proc/driver/nvidia/version", "dev/nvidia0", "dev/nvidiactl"))
    return shutil.which("nvidia-smi", path=path)  # Windows: the driver installs it in System32


def cuda_toolkit(root: Path, path: str, env: Mapping[str, str]) -> str | None:
    found = shutil.which("nvcc", path=path)
    if found:
        return found
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if home and shutil.which("nvcc", path=str(Path(home) / "bin")):
            return str(Path(home) / "bin" / "nvcc")
    return first_existing(root, ("usr/local/cuda/bin/nvcc",))


def vulkan_loader(root: Path, env: Mapping[str, str], system: str) -> str | None:
    if system == "Windows":
        loader = Path(env.get("SystemRoot", r"C:\Windows")) / "System32" / "vulkan-1.dll"
        return str(loader) if loader.exists() else None
    return first_existing(root, tuple(f"{d}/libvulkan.so.1" for d in LOADER_DIRS))


def vulkan_devices(root: Path, path: str, run: Callable[[list[str]], str | None]) -> tuple[str | None, str | None]:
    """(a GPU-type Vulkan device, a CPU-only device) — from vulkaninfo when it answers, else from the
    drivers' manifests beside a GPU device node (/dev/dri/renderD*, /dev/nvidia0)."""
    tool = shutil.which("vulkaninfo", path=path)
    summary = run([tool, "--summary"]) if tool else None
    if summary:
        devices = parse_vulkaninfo(summary)
        gpus = [f"{name} ({kind})" for name, kind in devices if kind in GPU_DEVICE_TYPES]
        cpus = [f"{name} ({kind})" for name, kind in devices if kind not in GPU_DEVICE_TYPES]
        return (gpus[0] if gpus else None), (cpus[0] if cpus and not gpus else None)
    manifests = sorted(
        p.name for d in ICD_DIRS if (root / d).is_dir() for p in (root / d).glob("*.json") if p.is_file()
    )
    gpu_drivers = [m for m in manifests if not m.startswith(CPU_ICDS)]
    nodes = sorted((root / "dev" / "dri").glob("renderD*")) if (root / "dev" / "dri").is_dir() else []
    node = "/dev/dri/" + nodes[0].name if nodes else first_existing(root, ("dev/nvidia0",))
    if gpu_drivers and node:
        return f"{gpu_drivers[0]} with {node}", None
    cpu_drivers = [m for m in manifests if m.startswith(CPU_ICDS)]
    return None, (f"{cpu_drivers[0]}, lavapipe" if cpu_drivers else None)


def parse_vulkaninfo(summary: str) -> list[tuple[str, str]]:
    """(deviceName, device type without its PHYSICAL_DEVICE_TYPE_ prefix) per device of `vulkaninfo --summary`."""
    names = re.findall(r"deviceName\s*=\s*(.+)", summary)
    kinds = re.findall(r"deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(\w+)", summary)
    return [(name.strip(), kind) for name, kind in zip(names, kinds, strict=False)]


def main() -> int:
    try:
        choice = choose(gather(), os.environ)
    except BackendChoiceError as error:
        print(f"lmsp-tray: {error}", file=sys.stderr)
        return 2
    print(f"{choice.backend}: {choice.reason}" + (f" (CMAKE_ARGS={choice.cmake_args})" if choice.cmake_args else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
