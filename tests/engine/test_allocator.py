"""The model process's memory allocator (`engine/allocator.py`).

Why it matters: llama.cpp's CPU backend takes its flash-attention scratch from `new[]`, and
glibc puts an allocation that large off a 64-byte boundary, which made prompt evaluation about
12% slower (benchmarks/cold_prefill.py). The choice of library is checked on folders made here;
the real model process is checked on this machine's jemalloc (`.ci/run` and the README's first
command install libjemalloc2): it is mapped into the model's process, and only there, and
`allocator = "system"` keeps it out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from generation import entry_for, generate
from gguf_factory import write_tiny_gguf

from lmsp_tray.engine import allocator
from lmsp_tray.engine.jobs import LENGTH
from lmsp_tray.engine.load_plan import LoadOptions, plan_load
from lmsp_tray.engine.process import ModelProcess


def lib(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\x7fELF")
    return path


def test_jemalloc_comes_first_then_tcmalloc(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert allocator.find("auto", [first, second], "linux") is None  # nothing installed: the C library's
    tc = lib(first, "libtcmalloc_minimal.so.4")
    assert allocator.find("auto", [first, second], "linux") == allocator.Allocator("tcmalloc", tc)
    je = lib(second, "libjemalloc.so.2")  # in a later folder, still preferred
    assert allocator.find("auto", [first, second], "linux") == allocator.Allocator("jemalloc", je)
    assert allocator.find("system", [first, second], "linux") is None
    assert allocator.find("auto", [first, second], "darwin") is None  # a preload is a Linux (glibc) matter
    assert allocator.find("auto", [first, second], "win32") is None


def test_the_preload_keeps_the_users_own(tmp_path: Path) -> None:
    je = allocator.Allocator("jemalloc", tmp_path / "libjemalloc.so.2")
    assert je.environment({}) == {"LD_PRELOAD": str(je.path)}
    assert je.environment({"LD_PRELOAD": "/opt/mine.so"}) == {"LD_PRELOAD": f"{je.path} /opt/mine.so"}
    tc = allocator.Allocator("tcmalloc", tmp_path / "libtcmalloc_minimal.so.4")
    quiet = tc.environment({})
    assert int(quiet["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40  # weights are not news
    assert "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" not in tc.environment({"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "1"})


def mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_the_model_process_runs_on_the_installed_allocator(tmp_path: Path) -> None:
    found = allocator.find("auto")
    if found is None:
        pytest.skip("no jemalloc or tcmalloc here (.ci/run installs libjemalloc2)")
    entry = entry_for(write_tiny_gguf(tmp_path / "tiny.gguf"))
    plan = plan_load(entry, LoadOptions(parallel=1, context_cap=256), gpu_free_bytes=0, cores=1)
    for choice in ("auto", "system"):
        model = ModelProcess(entry, LoadOptions(threads=1, allocator=choice), plan)
        try:
            maps = mapped(model.pid)
            if choice == "auto":
                assert model.allocator == found.name and str(found.path) in maps
            else:
                assert model.allocator == "system" and found.path.name not in maps
            prompt = model.tokenize_prompt(model.render([{"role": "user", "content": "hello world"}]))
            _, finish = generate(model, prompt, 8)
            assert finish.reason == LENGTH and finish.output_tokens == 8
        finally:
            model.close()
    assert found.path.name not in mapped(os.getpid())  # the service's own process keeps its malloc
