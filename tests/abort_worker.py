"""A model process whose llama.cpp aborts on its first job, the way a failed GGML_ASSERT does.

The real worker (`lmsp_tray.runner.worker`) with one change: submitting a job
calls ggml's own `ggml_abort` (what every `GGML_ASSERT` ends in: it prints the
failed assertion to stderr and aborts the process). Used by test_model_process.py.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from lmsp_tray.runner import model as model_module
from lmsp_tray.runner import worker


def submit(self, job) -> None:
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(next(p for p in lib_dir.iterdir() if p.name.startswith("libggml-base"))))
    base.ggml_abort(b"ggml/src/ggml-cpu/ops.cpp", 4242, b"GGML_ASSERT(%s) failed", b"n_tokens <= n_batch")


model_module.LlamaModel.submit = submit  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(worker.main())
