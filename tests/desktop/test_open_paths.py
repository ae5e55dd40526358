"""Open models folder and View logs on a desktop without xdg-open: the file manager's own D-Bus
service (org.freedesktop.FileManager1, a fake of it from tests/dbus_fakes.py) on a private bus,
called by `open_path` in a process whose PATH has neither `gio` nor `xdg-open`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from desktop_support import ROOT, DBusFake, PrivateBus, dbus_missing
from support import wait_until

pytestmark = pytest.mark.skipif(bool(dbus_missing()), reason=str(dbus_missing()))


def open_in_child(address: str, target, folder: bool, bindir) -> subprocess.CompletedProcess:
    code = (
        "import sys; from pathlib import Path; from lmsp_tray.desktop.system import open_path\n"
        "print(open_path(Path(sys.argv[1]), 'linux', folder=sys.argv[2] == 'folder'))\n"
    )
    env = {
        "PATH": str(bindir),  # no gio, no xdg-open
        "PYTHONPATH": str(ROOT),
        "DBUS_SESSION_BUS_ADDRESS": address,
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    return subprocess.run(
        [sys.executable, "-c", code, str(target), "folder" if folder else "file"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_folders_and_files_open_through_the_file_manager_service(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    models = tmp_path / "my models"
    models.mkdir()
    log = tmp_path / "lmsp-tray.log"
    log.write_text("a log line\n")
    with PrivateBus() as bus:
        fake = DBusFake(bus.address, "filemanager", tmp_path / "fm.jsonl")
        try:
            out = open_in_child(bus.address, models, True, bindir)
            assert out.returncode == 0 and out.stdout.strip() == "org.freedesktop.FileManager1", out.stderr
            out = open_in_child(bus.address, log, False, bindir)
            assert out.returncode == 0, out.stderr
            calls = wait_until(
                lambda: len(fake.records()) >= 2 and fake.records(), 30, "the file manager calls", ignoring=Exception
            )
            assert calls[0]["call"] == "ShowFolders" and calls[0]["args"][0] == [models.as_uri()]
            assert calls[1]["call"] == "ShowItems" and calls[1]["args"][0] == [log.as_uri()]  # selected in its folder
        finally:
            fake.stop()
        # No file manager service either: the message names the folder, whole.
        out = open_in_child(bus.address, models, True, bindir)
    assert out.returncode == 1
    assert (
        f"no file manager answered (tried gio, xdg-open, the FileManager1 D-Bus service); the folder is {models}"
        in (out.stderr)
    )
