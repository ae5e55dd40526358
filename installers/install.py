"""Install lmsp-tray into a virtual environment with llama.cpp built for this machine's GPU.

The README's first command runs this after apt: it makes the venv (./.venv), chooses the llama.cpp
backend (llama_backend.py: CUDA, Vulkan, Metal or the CPU, or LMSP_BACKEND / CMAKE_ARGS when given),
takes or builds llama-cpp-python's wheel for it (llama_wheel.py), installs that wheel and then the
project with its extras. A GPU build that fails falls back to the CPU build and says why: the venv
never holds a half-built llama.cpp, and nothing is installed into it before a wheel exists.
Standard library only: it runs before the venv exists.

Usage: python3 installers/install.py [--venv DIR] [--extras demo,test] [--no-project] [--strict]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import venv
from dataclasses import replace
from pathlib import Path

from llama_backend import BackendChoiceError, Choice, choose, default_cmake_args, gather
from llama_wheel import Wheel, WheelBuildError, cache_root, obtain

REPO = Path(__file__).resolve().parent.parent


def say(text: str) -> None:
    print(f"lmsp-tray install: {text}", flush=True)


def pinned_version(pyproject: Path) -> str:
    """The llama-cpp-python release pyproject.toml pins (the engine calls its C API)."""
    found = re.search(r'"llama-cpp-python==([\w.]+)"', pyproject.read_text())
    if not found:
        raise SystemExit("lmsp-tray install: pyproject.toml pins no llama-cpp-python==VERSION")
    return found.group(1)


def wheel_for(python: str, choice: Choice, version: str, log: Path, fallback: bool = True) -> Wheel:
    """The chosen backend's wheel; if a GPU build fails, the CPU build, saying so (unless not `fallback`)."""
    system = platform.system()
    try:
        return obtain(python, choice, version, os.environ, system, log, say)
    except WheelBuildError as error:
        if choice.backend == "cpu" or not fallback:
            raise
        say(f"{error}; building for the CPU instead (full log: {log}). The service works, without the GPU.")
        cpu = replace(choice, backend="cpu", cmake_args=default_cmake_args("cpu", system), reason=str(error))
        return obtain(python, cpu, version, os.environ, system, log.with_suffix(".cpu.log"), say)


def pip(python: str, *args: str) -> None:
    done = subprocess.run([python, "-m", "pip", *args], check=False)
    if done.returncode != 0:
        raise SystemExit(f"lmsp-tray install: pip {' '.join(args)} failed ({done.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".venv", help="the virtual environment (default ./.venv)")
    parser.add_argument("--extras", default="demo", help="the project's extras, comma-separated (default demo)")
    parser.add_argument("--no-project", action="store_true", help="install llama-cpp-python only")
    parser.add_argument("--strict", action="store_true", help="fail when the GPU build fails (CI), no CPU fallback")
    options = parser.parse_args(argv)
    try:
        choice = choose(gather(), os.environ)
    except BackendChoiceError as error:
        print(f"lmsp-tray install: {error}", file=sys.stderr)
        return 2
    say(f"llama.cpp backend: {choice.backend} ({choice.reason})")
    if not (options.venv / "bin" / "python").exists() and not (options.venv / "Scripts" / "python.exe").exists():
        venv.EnvBuilder(with_pip=True, symlinks=os.name != "nt").create(options.venv)  # as `python3 -m venv`
    python = str(options.venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    version = pinned_version(REPO / "pyproject.toml")
    logs = cache_root(os.environ).parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        log = logs / f"llama-cpp-python-{choice.backend}.log"
        wheel = wheel_for(python, choice, version, log, fallback=not options.strict)
    except WheelBuildError as error:
        print(f"lmsp-tray install: {error}; nothing was installed", file=sys.stderr)
        return 1
    say(f"llama-cpp-python {version} for {wheel.backend}: {'built' if wheel.built else 'from the cache'} {wheel.path}")
    installed = Path(python).parent.parent / "lmsp-llama-wheel"  # which wheel this venv holds, once installed
    stamp = f"{wheel.path} {wheel.path.stat().st_size} {wheel.path.stat().st_mtime_ns}"
    if not installed.exists() or installed.read_text() != stamp:
        pip(python, "install", "-q", "--force-reinstall", "--no-deps", str(wheel.path))
        installed.write_text(stamp)
    target = [str(wheel.path)]  # its dependencies, and the same wheel kept by the project's pin
    if not options.no_project:
        extras = f"[{options.extras}]" if options.extras else ""
        target += ["-e", f"{REPO}{extras}"]
    pip(python, "install", "-q", *target)
    say(
        f"installed with llama.cpp for {wheel.backend}. Another backend: LMSP_BACKEND=cpu|vulkan|cuda|metal "
        "python3 installers/install.py (or CMAKE_ARGS=...)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
