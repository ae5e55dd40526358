"""The llama.cpp runtime of this process: backend start, log capture, devices and threads.

llama.cpp keeps process-wide state (backends, the log callback). `Runtime` is
the one object that owns it; the daemon creates it once and hands it to
every model. llama.cpp's own log lines are kept (warnings and errors) so a
failed load can say why, instead of printing to the user's terminal.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

log = logging.getLogger("lmsp_tray.engine")

_GGML_LOG_LEVEL_WARN = 3
_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5
_DEVICE_TYPE_GPU = 1
_DEVICE_TYPE_IGPU = 2


@dataclass(frozen=True)
class Device:
    """An accelerator llama.cpp can offload to."""

    name: str
    description: str
    free_bytes: int
    total_bytes: int


def physical_cores() -> int:
    """Physical CPU cores (not hyper-threads); llama.cpp decodes fastest with one thread per core."""
    try:
        cores: set[tuple[str, str]] = set()
        physical = core = None
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    physical = value
                elif key == "core id":
                    core = value
                elif not key and core is not None:
                    cores.add((physical or "0", core))
                    physical = core = None
        if core is not None:
            cores.add((physical or "0", core))
        if cores:
            return len(cores)
    except OSError:
        pass
    count = os.cpu_count() or 2
    return max(1, count // 2) if count > 4 else count


class Runtime:
    """Process-wide llama.cpp state. Create one, call `close()` at exit."""

    def __init__(self, *, capture_logs: bool = True) -> None:
        self._lock = threading.Lock()
        self._log_lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=64)
        self._count = 0
        self._partial = ""
        self._callback = None
        self._restore_log = lambda: None
        if capture_logs:
            self._callback = llama_cpp.llama_log_callback(self._on_log)
            llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
            # Also when a Runtime is dropped without close(): runs before the callback is freed.
            self._restore_log = weakref.finalize(self, _default_log_handler)
        llama_cpp.llama_backend_init()
        self.supports_gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        self.devices = self._gpu_devices() if self.supports_gpu_offload else []

    # -- logs ---------------------------------------------------------------------------------
    def _on_log(self, level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if level not in (_GGML_LOG_LEVEL_WARN, _GGML_LOG_LEVEL_ERROR, _GGML_LOG_LEVEL_CONT):
            return
        line = text.decode("utf-8", errors="replace")
        with self._lock:
            self._partial += line
            if self._partial.endswith("\n"):
                message = self._partial.strip()
                self._partial = ""
                if message:
                    self._count += 1
                    self._log_lines.append((self._count, message))
                    log.debug("llama.cpp: %s", message)

    def mark(self) -> int:
        """A position in the captured log; `messages_since(mark)` returns what came after."""
        with self._lock:
            return self._count

    def messages_since(self, mark: int) -> list[str]:
        with self._lock:
            return [text for n, text in self._log_lines if n > mark]

    # -- devices ------------------------------------------------------------------------------
    def _gpu_devices(self) -> list[Device]:
        """GPUs llama.cpp's backends see (through ggml's device registry)."""
        lib = _ggml_library()
        if lib is None:
            return []
        try:
            lib.ggml_backend_dev_count.restype = ctypes.c_size_t
            lib.ggml_backend_dev_get.restype = ctypes.c_void_p
            lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
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
            devices = []
            for i in range(lib.ggml_backend_dev_count()):
                dev = lib.ggml_backend_dev_get(i)
                if lib.ggml_backend_dev_type(dev) not in (_DEVICE_TYPE_GPU, _DEVICE_TYPE_IGPU):
                    continue
                free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
                lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
                devices.append(
                    Device(
                        name=(lib.ggml_backend_dev_name(dev) or b"gpu").decode(errors="replace"),
                        description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                        free_bytes=free.value,
                        total_bytes=total.value,
                    )
                )
            return devices
        except (AttributeError, OSError) as exc:
            log.info("could not enumerate GPU devices: %s", exc)
            return []

    def refresh_devices(self) -> list[Device]:
        if self.supports_gpu_offload:
            self.devices = self._gpu_devices()
        return self.devices

    @property
    def has_gpu(self) -> bool:
        return bool(self.devices)

    def close(self) -> None:
        self._restore_log()


def _default_log_handler() -> None:
    """Hand llama.cpp's log back to llama-cpp-python's own handler before our callback is freed
    (llama.cpp would otherwise call into freed memory the next time it logs)."""
    from llama_cpp._logger import llama_log_callback

    llama_cpp.llama_log_set(llama_log_callback, ctypes.c_void_p(0))


def _ggml_library() -> ctypes.CDLL | None:
    """The ggml shared library shipped inside the llama_cpp package."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll", "libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        candidate = lib_dir / name
        if candidate.exists():
            try:
                return ctypes.CDLL(str(candidate))
            except OSError:
                continue
    return None
