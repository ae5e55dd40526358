"""llama.cpp's backends and devices, as ggml's registry lists them, read straight from its libraries.

Why ctypes on the shared libraries `llama_cpp` loads (`library_folder`) rather than the package itself:
the device probe (`probe`) runs at every service start and the `llama_cpp` module takes about half
a second to import (numpy, thousands of function bindings), where loading `libllama` and asking
ggml takes a tenth of that. `runtime.Runtime` lists its devices the same way. The answer is
`engine.devices.Devices`: the build's accelerator backend ("cpu" when it has none) and every device
with its type, backend and memory.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from pathlib import Path

from lmsp_tray.engine.devices import CPU_BACKENDS, GPU_TYPES, DeviceInfo, Devices

log = logging.getLogger("lmsp_tray.runner")

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # ggml_backend_dev_type
GGML_NAMES = ("libggml.so", "libggml.dylib", "ggml.dll", "libggml-base.so", "libggml-base.dylib", "ggml-base.dll")
LLAMA_NAMES = ("libllama.so", "libllama.dylib", "llama.dll")


def library_folder() -> Path | None:
    """Where `llama_cpp` loads llama.cpp's libraries from: `LLAMA_CPP_LIB_PATH` where it is set (as
    `llama_cpp` itself reads it: another build of the same llama.cpp, e.g. one made for a GPU or for
    older CPUs), else the package's `lib` folder (the package is found, not imported). Asking any
    other copy would describe a build the model process does not run, and load a second ggml with
    its own backends beside the one that decodes."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def library(names: tuple[str, ...]) -> ctypes.CDLL | None:
    """The first of `names` that loads from `library_folder()`."""
    lib_dir = library_folder()
    if lib_dir is None:
        return None
    for name in names:
        candidate = lib_dir / name
        if candidate.exists():
            try:
                return ctypes.CDLL(str(candidate))
            except OSError:
                continue
    return None


def probe() -> Devices:
    """Start llama.cpp's backend in this process and list what it sees (the device probe's work)."""
    llama = library(LLAMA_NAMES)
    if llama is None:
        raise OSError("llama.cpp's library was not found (is llama-cpp-python installed?)")
    llama.llama_backend_init.restype = None
    llama.llama_backend_init()
    llama.llama_supports_gpu_offload.restype = ctypes.c_bool
    return devices(bool(llama.llama_supports_gpu_offload()))


def devices(gpu_offload: bool) -> Devices:
    """The build's backend and every device its backends see (ggml's device registry); `gpu_offload`
    is llama.cpp's `llama_supports_gpu_offload()`."""
    lib = library(GGML_NAMES)
    if lib is None:
        return Devices(gpu_offload=gpu_offload, error="no ggml library found")
    try:
        lib.ggml_backend_reg_count.restype = ctypes.c_size_t
        lib.ggml_backend_reg_get.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_reg_name.restype = ctypes.c_char_p
        lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_name.restype = ctypes.c_char_p
        lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_description.restype = ctypes.c_char_p
        lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.restype = None
        lib.ggml_backend_dev_memory.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
        ]

        def reg_name(reg: int | None) -> str:
            return (lib.ggml_backend_reg_name(reg) or b"?").decode(errors="replace").lower() if reg else "?"

        registries = [reg_name(lib.ggml_backend_reg_get(i)) for i in range(lib.ggml_backend_reg_count())]
        found = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            found.append(
                DeviceInfo(
                    name=(lib.ggml_backend_dev_name(dev) or b"gpu").decode(errors="replace"),
                    description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    type=DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "accel"),
                    backend=reg_name(lib.ggml_backend_dev_backend_reg(dev)),
                    total_bytes=total.value,
                    free_bytes=free.value,
                )
            )
    except (AttributeError, OSError) as exc:
        log.info("could not enumerate devices: %s", exc)
        return Devices(gpu_offload=gpu_offload, error=f"could not enumerate devices: {exc}")
    # The build's accelerator: the backend of its first GPU, else the first backend that is not the
    # CPU's own (or a helper of it: BLAS, RPC), else the CPU.
    gpu_backends = [d.backend for d in found if d.type in GPU_TYPES]
    others = [name for name in registries if name not in CPU_BACKENDS]
    backend = (gpu_backends or others or ["cpu"])[0]
    return Devices(backend=backend, gpu_offload=gpu_offload, devices=tuple(found))


def weights_stay_unrepacked() -> bool:
    """Whether models load without llama.cpp's extra CPU buffer types, their weights as the file has
    them: where this build has the AMX one. llama.cpp's AMX matrix multiplication (weights repacked
    into the AMX buffer type) ends the process with SIGSEGV at its first decode of a K-quant model
    (Gemma 3 270M Q4_K_M on a Xeon with AMX under KVM: `ldtilecfg` in ggml_backend_amx_mul_mat), where
    the plain CPU path decodes the same tokens; CPU_REPACK goes with AMX (llama.cpp has one switch for
    both). One answer for the model process and the benchmarks that run llama-server beside it."""
    return "AMX" in cpu_extra_buffer_types()


def cpu_extra_buffer_types() -> tuple[str, ...]:
    """The names of the CPU backend's extra weight buffer types in this build ("AMX", "CPU_REPACK", ...):
    where llama.cpp repacks weights for the CPU's matrix units. Empty when they cannot be read."""
    lib = library(GGML_NAMES)
    if lib is None:
        return ()
    try:
        lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ggml_backend_buft_name.restype = ctypes.c_char_p
        lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
        cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
        reg = lib.ggml_backend_dev_backend_reg(cpu) if cpu else None
        address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
        if not address:
            return ()
        get_extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
        listed = get_extra(cpu)
        names = []
        i = 0
        while listed and listed[i]:
            names.append((lib.ggml_backend_buft_name(listed[i]) or b"?").decode(errors="replace"))
            i += 1
        return tuple(names)
    except (AttributeError, OSError) as exc:
        log.info("could not list the CPU's extra buffer types: %s", exc)
        return ()
