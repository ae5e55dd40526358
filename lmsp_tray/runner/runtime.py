"""The llama.cpp runtime of this process: backend start, log capture and devices.

llama.cpp keeps process-wide state (backends, the log callback). `Runtime` is
the one object that owns it; a model process creates it once (`worker`) and
hands it to its model, with what llama.cpp sees (`devices`, listed by
`backends` as the device probe lists it). llama.cpp's own log lines are
kept (warnings and errors) so a failed load can say why, instead of printing
to the user's terminal.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import weakref

import llama_cpp

from lmsp_tray.runner import backends

log = logging.getLogger("lmsp_tray.runner")

_GGML_LOG_LEVEL_WARN = 3
_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5


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
        self.devices = backends.devices(self.supports_gpu_offload)

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

    @property
    def has_gpu(self) -> bool:
        return self.devices.has_gpu

    def close(self) -> None:
        self._restore_log()


def _default_log_handler() -> None:
    """Hand llama.cpp's log back to llama-cpp-python's own handler before our callback is freed
    (llama.cpp would otherwise call into freed memory the next time it logs)."""
    from llama_cpp._logger import llama_log_callback

    llama_cpp.llama_log_set(llama_log_callback, ctypes.c_void_p(0))
