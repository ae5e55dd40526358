"""Files only the user can read: folders 0700, files 0600 on POSIX, whatever the umask.

Stored responses, conversations, token records and logs are private. Folders and files are
created with these modes and chmod-ed after (a umask can only take bits away, and an odd one
could take the owner's too), and an existing install is tightened when the service starts
(`Paths.ensure` calls `tighten`). On Windows the user's profile folder already keeps others
out, and chmod cannot say more, so these are no-ops there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
POSIX = os.name == "posix"


def private_dir(path: Path) -> Path:
    """Make `path` (and missing parents) and leave it 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    if POSIX:
        _chmod(path, PRIVATE_DIR)
    return path


def private_file(path: Path, *, create: bool = False) -> None:
    """Leave `path` 0600; with `create`, make it empty first when it does not exist."""
    if create and not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    if POSIX and path.is_file():
        _chmod(path, PRIVATE_FILE)


def private_opener(path: str, flags: int) -> int:
    """An `open(..., opener=)` that creates files 0600 (rotating logs make new files)."""
    fd = os.open(path, flags, PRIVATE_FILE)
    if POSIX:
        with contextlib.suppress(OSError):
            os.fchmod(fd, PRIVATE_FILE)
    return fd


def tighten(files: Iterable[Path]) -> None:
    """An existing install made private: each of `files` that exists left 0600."""
    for file in files:
        private_file(file)


def _chmod(path: Path, mode: int) -> None:
    with contextlib.suppress(OSError):  # not ours to change (a shared mount): the service still runs
        if (path.stat().st_mode & 0o7777) != mode:
            os.chmod(path, mode)
