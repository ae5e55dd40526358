"""The llama-cpp-python wheel for one backend: taken from lmsp-tray's own wheel cache, or built once.

pip's wheel cache keys a source build by the sdist alone, not by CMAKE_ARGS: a CPU wheel built
yesterday would be handed to today's Vulkan install, or the reverse, silently. So the wheel is built
with `pip wheel --no-cache-dir` into a folder per backend (~/.cache/lmsp-tray/wheels/<backend>/, or
<backend>-<hash> for CMake arguments of the person's own) and installed from there; a build that
fails leaves nothing in that folder.

A Vulkan build needs, besides the loader, the Vulkan headers, glslc (the shaders compile during the
build) and the SPIR-V headers (Debian/Ubuntu: libvulkan-dev glslc spirv-headers, installed with apt
when missing). The vendored llama.cpp needs headers with VK_EXT_layer_settings (1.3.261 or newer):
Debian 12 has 1.3.239 and Ubuntu 22.04 1.3.204, where the build fails in ggml-vulkan.cpp. There the
newer release's libvulkan-dev (Debian 13's, Ubuntu 24.04's) is downloaded with a private apt
configuration — the system's sources, packages and apt state untouched — unpacked into the cache
and given to CMake as Vulkan_INCLUDE_DIR; the build still links the system's loader.
Standard library only: it runs before the virtual environment exists.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from llama_backend import Choice, default_cmake_args

# The Vulkan headers the vendored llama.cpp's Vulkan backend compiles against (VK_EXT_layer_settings).
VULKAN_HEADERS_NEEDED = (1, 3, 261)
VULKAN_BUILD_PACKAGES = ("libvulkan-dev", "glslc", "spirv-headers")

# A release with new enough headers, per distribution (ID in /etc/os-release): its archive and keyrings.
NEWER_VULKAN_HEADERS = {
    "debian": (
        "http://deb.debian.org/debian",
        "trixie",
        "/usr/share/keyrings/debian-archive-trixie-stable.gpg /usr/share/keyrings/debian-archive-trixie-automatic.gpg",
    ),
    "ubuntu": ("http://archive.ubuntu.com/ubuntu", "noble", "/usr/share/keyrings/ubuntu-archive-keyring.gpg"),
}


class WheelBuildError(RuntimeError):
    """The wheel could not be built for this backend; the message says why, the log holds the rest."""


@dataclass(frozen=True)
class Wheel:
    path: Path
    backend: str
    built: bool  # False: taken from the cache


def cache_root(env: Mapping[str, str]) -> Path:
    """LMSP_WHEEL_CACHE, else $XDG_CACHE_HOME/lmsp-tray/wheels (~/.cache/lmsp-tray/wheels)."""
    if env.get("LMSP_WHEEL_CACHE"):
        return Path(env["LMSP_WHEEL_CACHE"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "lmsp-tray" / "wheels"


def cache_folder(root: Path, choice: Choice, system: str) -> Path:
    """One folder per backend; CMake arguments other than the backend's own get a folder of their own."""
    if choice.cmake_args == default_cmake_args(choice.backend, system) or choice.cmake_args == "":
        return root / choice.backend
    digest = hashlib.sha256(choice.cmake_args.encode()).hexdigest()[:10]
    return root / f"{choice.backend}-{digest}"


def cached_wheel(folder: Path, version: str) -> Path | None:
    found = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl")) if folder.is_dir() else []
    return found[-1] if found else None


def obtain(python: str, choice: Choice, version: str, env: Mapping[str, str], system: str, log: Path, say) -> Wheel:
    """The wheel for `choice`: from the cache, else built (Vulkan's packages and headers first)."""
    folder = cache_folder(cache_root(env), choice, system)
    found = cached_wheel(folder, version)
    if found:
        return Wheel(found, choice.backend, built=False)
    if choice.backend == "vulkan" and system == "Linux" and "Vulkan_INCLUDE_DIR" not in choice.cmake_args:
        choice = replace(choice, cmake_args=choice.cmake_args + vulkan_include_args(env, say))
    say(
        f"building llama-cpp-python {version} for {choice.backend} (CMAKE_ARGS={choice.cmake_args or 'none'}); log: {log}"
    )
    return Wheel(build(python, choice, version, folder, env, log), choice.backend, built=True)


def build(python: str, choice: Choice, version: str, folder: Path, env: Mapping[str, str], log: Path) -> Path:
    """`pip wheel --no-cache-dir` into a scratch folder, moved into the cache only when it succeeded."""
    folder.mkdir(parents=True, exist_ok=True)
    run_env = dict(env)
    run_env["CMAKE_ARGS"] = choice.cmake_args
    run_env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix=".building-", dir=folder) as scratch:
        argv = [python, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "-v", f"llama-cpp-python=={version}"]
        with log.open("w") as out:
            done = subprocess.run(
                [*argv, "-w", scratch], stdout=out, stderr=subprocess.STDOUT, env=run_env, check=False
            )
        wheels = sorted(Path(scratch).glob("llama_cpp_python-*.whl"))
        if done.returncode != 0 or not wheels:
            raise WheelBuildError(f"the {choice.backend} build failed ({last_error(log)})")
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
    return target


def last_error(log: Path) -> str:
    """The first compiler or CMake error line of a build log, or its last line."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    for line in lines:
        if re.search(r"error:|CMake Error|Could NOT find", line):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "no output"


def vulkan_include_args(env: Mapping[str, str], say) -> str:
    """Ensure Vulkan's build packages; new enough headers, private ones if the system's are too old."""
    ensure_packages(VULKAN_BUILD_PACKAGES, say)
    if not shutil.which("glslc"):
        raise WheelBuildError("the Vulkan build needs glslc (Debian/Ubuntu: glslc; Fedora: glslc; Arch: shaderc)")
    system_headers = header_version(Path("/usr/include/vulkan/vulkan_core.h"))
    if system_headers is None:
        raise WheelBuildError("no Vulkan headers (Debian/Ubuntu: libvulkan-dev; Fedora: vulkan-headers)")
    if system_headers >= VULKAN_HEADERS_NEEDED:
        return ""
    shown = ".".join(map(str, system_headers))
    say(f"the system's Vulkan headers are {shown}, llama.cpp needs 1.3.261 or newer: fetching newer ones privately")
    include = private_vulkan_headers(cache_root(env).parent / "vulkan-headers")
    return f" -DVulkan_INCLUDE_DIR={include}"


def header_version(header: Path) -> tuple[int, int, int] | None:
    """(1, 3, 239) from vulkan_core.h's VK_HEADER_VERSION_COMPLETE and VK_HEADER_VERSION."""
    if not header.is_file():
        return None
    text = header.read_text(errors="replace")
    patch = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    complete = re.search(r"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(\d+,\s*(\d+),\s*(\d+)", text)
    if not patch or not complete:
        return None
    return int(complete.group(1)), int(complete.group(2)), int(patch.group(1))


def ensure_packages(packages: tuple[str, ...], say) -> None:
    """apt-get install what dpkg does not have (sudo when not root); nothing on systems without apt."""
    if not shutil.which("dpkg") or not shutil.which("apt-get"):
        return
    missing = [
        p for p in packages if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode != 0
    ]
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    say(f"installing the Vulkan build's packages: {' '.join(missing)}")
    done = subprocess.run([*sudo, "apt-get", "install", "-y", *missing], check=False)
    if done.returncode != 0:
        raise WheelBuildError(f"apt-get could not install {' '.join(missing)}")


def os_release_id() -> str:
    text = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    found = re.search(r'^ID="?([\w.-]+)"?', text, re.MULTILINE)
    return found.group(1) if found else ""


def private_vulkan_headers(store: Path) -> Path:
    """The newer release's libvulkan-dev unpacked under `store`: its usr/include (downloaded once).

    apt runs with a configuration of its own (sources, lists, cache, preferences all under `store`), so
    the system's sources, pins and package state stay as they were; apt checks the archive's signature
    with the keyring the distribution already ships."""
    distro = os_release_id()
    if distro not in NEWER_VULKAN_HEADERS:
        raise WheelBuildError(
            f"the system's Vulkan headers are too old and {distro or 'this system'} has no known newer ones"
        )
    archive, suite, keyrings = NEWER_VULKAN_HEADERS[distro]
    unpacked = store / suite
    include = unpacked / "usr" / "include"
    if (include / "vulkan" / "vulkan_core.h").is_file():
        return include
    apt = store / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d", "debs"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list.d" / f"{suite}.sources").write_text(
        f"Types: deb\nURIs: {archive}\nSuites: {suite}\nComponents: main\nSigned-By: {keyrings}\n"
    )
    options = [
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::Etc::SourceParts={apt / 'sources.list.d'}",
        "-o", f"Dir::State::Lists={apt / 'lists'}",
        "-o", f"Dir::Cache={apt / 'cache'}",
        "-o", "Dir::Etc::Preferences=/dev/null",
        "-o", f"Dir::Etc::PreferencesParts={apt / 'preferences.d'}",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip
    steps = (["apt-get", *options, "update", "-qq"], ["apt-get", *options, "download", "libvulkan-dev"])
    for argv in steps:
        done = subprocess.run(argv, cwd=apt / "debs", capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise WheelBuildError(f"could not fetch {suite}'s libvulkan-dev: {done.stderr.strip()[-300:]}")
    debs = sorted((apt / "debs").glob("libvulkan-dev_*.deb"))
    if not debs:
        raise WheelBuildError(f"apt downloaded no libvulkan-dev from {suite}")
    with tempfile.TemporaryDirectory(dir=store) as scratch:
        done = subprocess.run(["dpkg", "-x", str(debs[-1]), scratch], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise WheelBuildError(f"dpkg -x {debs[-1].name}: {done.stderr.strip()[-300:]}")
        shutil.rmtree(unpacked, ignore_errors=True)
        os.replace(scratch, unpacked)
        os.mkdir(scratch)  # TemporaryDirectory removes it again
    return include
