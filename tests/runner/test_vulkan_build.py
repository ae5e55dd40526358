"""llama.cpp's Vulkan build on a real Vulkan device (lavapipe in CI): it sees the device, offloads every
layer to it, and decodes greedily the same tokens as the CPU build.

Runs in .venv-vulkan only (marked `vulkan`, vulkan_support.py); the CPU build it is compared with is the
main venv's (LMSP_CPU_PYTHON, default ./.venv/bin/python). Each build runs greedy_probe.py in a process of
its own. The near-tie rule: the tokens must be equal up to the first step where the CPU build's two best
logits are within NEAR_TIE of each other (a float rounding difference may then pick the other one); the
generated test model's margins are far wider, so in practice all of them must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vulkan, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "greedy_probe.py"
NEAR_TIE = 1e-3
N_TOKENS = 16


def greedy(python: str, model: Path, n_gpu_layers: int) -> dict:
    done = subprocess.run(
        [python, str(PROBE), str(model), str(n_gpu_layers), str(N_TOKENS)],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_python() -> str:
    python = os.environ.get("LMSP_CPU_PYTHON") or str(ROOT / ".venv" / "bin" / "python")
    if not Path(python).exists():
        pytest.fail(f"the CPU build's interpreter {python} is missing (set LMSP_CPU_PYTHON)")
    return python


def test_the_vulkan_build_sees_a_vulkan_device_and_decodes_as_the_cpu_build(tiny_gguf):
    gpu = greedy(sys.executable, tiny_gguf, 99)
    assert gpu["gpu_offload"], "this llama.cpp is not built for a GPU backend"
    vulkan = [d for d in gpu["devices"] if d["name"].startswith("Vulkan")]
    assert vulkan, gpu["devices"]
    print("devices:", [(d["name"], d["description"], d["total"] >> 20) for d in gpu["devices"]])
    assert vulkan[0]["total"] > 0 and 0 < vulkan[0]["free"] <= vulkan[0]["total"]
    assert gpu["offloaded"] is not None and gpu["offloaded"][0] == gpu["offloaded"][1] > 0  # every layer

    cpu = greedy(cpu_python(), tiny_gguf, 0)
    assert not cpu["gpu_offload"] and cpu["offloaded"] is None, "LMSP_CPU_PYTHON is not a CPU build"
    compared = next((i for i, m in enumerate(cpu["margins"]) if m < NEAR_TIE), N_TOKENS)
    print("tokens:", gpu["tokens"], "cpu:", cpu["tokens"], "smallest margin:", min(cpu["margins"]))
    assert gpu["tokens"][:compared] == cpu["tokens"][:compared]
    assert compared == N_TOKENS  # the generated model has no near tie: every token was compared
