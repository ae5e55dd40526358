"""Greedy tokens of a model under whichever llama-cpp-python runs this script, as one JSON line on stdout.

The Vulkan tests compare two builds of llama.cpp (the CPU venv's and the Vulkan venv's), which cannot be
loaded in one process: each runs this with its own interpreter. Usage:
`python greedy_probe.py MODEL N_GPU_LAYERS N_TOKENS` -> {"tokens", "margins", "offloaded", "devices"}:
the greedy token ids, the logit margin between the first and second choice at each step (the near-tie
rule), llama.cpp's "offloaded X/Y layers" line, and the devices ggml's registry lists (name, type, memory).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import tempfile
from pathlib import Path


def ggml_devices(lib_dir: Path) -> list[dict[str, object]]:
    ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, name).restype = ctypes.c_char_p
        getattr(ggml, name).argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    size = ctypes.POINTER(ctypes.c_size_t)
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size, size]
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        found.append(
            {
                "name": ggml.ggml_backend_dev_name(dev).decode(),
                "description": ggml.ggml_backend_dev_description(dev).decode(),
                "type": ggml.ggml_backend_dev_type(dev),  # 0 cpu, 1 gpu, 2 igpu, 3 accel
                "total": total.value,
                "free": free.value,
            }
        )
    return found


def main() -> int:
    model, n_gpu_layers, n_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)  # llama.cpp's log: read back for the offload line
        os.dup2(log.fileno(), 1)
        import llama_cpp
        import numpy as np

        llm = llama_cpp.Llama(model, n_gpu_layers=n_gpu_layers, n_ctx=256, n_batch=64, seed=0, verbose=True)
        tokens: list[int] = []
        margins: list[float] = []
        llm.eval(llm.tokenize(b"Once upon a time", add_bos=True))
        for _ in range(n_tokens):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))  # the last token's row
            row = sorted(enumerate(logits.tolist()), key=lambda kv: -kv[1])
            tokens.append(row[0][0])
            margins.append(row[0][1] - row[1][1])
            llm.eval([row[0][0]])
        llm.close()
        log.seek(0)
        said = log.read().decode(errors="replace")
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", said)
    answer = {
        "tokens": tokens,
        "margins": margins,
        "offloaded": [int(offloaded.group(1)), int(offloaded.group(2))] if offloaded else None,
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
        "devices": ggml_devices(Path(llama_cpp.__file__).parent / "lib"),
    }
    os.write(out, (json.dumps(answer) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
