"""The model process asks about the llama.cpp it runs: where `LLAMA_CPP_LIB_PATH` names another build
(as `llama_cpp` honours it), the backend questions (`runner.backends`: devices, the weights' buffer
types that decide repacking) go to that build, and no second ggml is loaded beside it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# What the model process does, in this order: `llama_cpp` loads its libraries, then a load asks
# `backends` whether the build repacks weights into the AMX buffer type (`weights_stay_unrepacked`).
ASK = """
import json
import llama_cpp
from lmsp_tray.runner import backends
types = backends.cpu_extra_buffer_types()
devices = backends.probe()
with open("/proc/self/maps") as fh:
    mapped = sorted({line.split()[-1] for line in fh if "libggml" in line or "libllama" in line})
print(json.dumps({"types": types, "mapped": mapped, "backend": devices.backend, "error": devices.error}))
"""


def ask(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", ASK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_another_build_named_by_llama_cpp_lib_path_is_the_one_asked(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    package_lib = Path(spec.origin).parent / "lib"
    assert (package_lib / "libllama.so").exists()
    build = tmp_path / "other-build"
    shutil.copytree(package_lib, build)  # the same llama.cpp, at another path (as a second build would be)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}

    own = ask(env)
    assert own["mapped"] and all(str(path).startswith(str(package_lib)) for path in own["mapped"])  # type: ignore[union-attr]

    other = ask({**env, "LLAMA_CPP_LIB_PATH": str(build)})
    mapped = [str(path) for path in other["mapped"]]  # type: ignore[union-attr]
    assert any("libggml-cpu.so" in path for path in mapped), mapped
    assert all(path.startswith(str(build)) for path in mapped), f"a second llama.cpp was loaded: {mapped}"
    assert other["types"] == own["types"] and other["backend"] == own["backend"] and other["error"] is None
