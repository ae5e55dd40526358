"""Files only the user can read: folders 0700, files 0600 on POSIX, whatever the umask.

Stored responses, conversations, token records and logs are private. Folders and files are
created with these modes and chmod-ed after (a umask can only take bits away, and an odd one
could take the owner's too), and an existing install is tightened when the service starts
(`Paths.ensure` calls `tighten`). On Windows the user's profile folder already keeps others
out, and chmod cannot say more, so these are no-ops there.

`write_private` is the one atomic file writer (`instance.json`, `service.json`, the owner
token file, the console's redirect page, `config.toml`; the login item with its own mode): a
reader sees the old file or the new one, whole, however many processes write it at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
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


def write_private(path: Path, data: bytes | str, *, mode: int = PRIVATE_FILE) -> None:
    """Replace `path` with `data` (str: UTF-8) in one rename, the file left `mode` (0600 unless told).

    The temporary file beside it has a name no other writer uses (pid and a random part) and is
    made with O_EXCL|O_NOFOLLOW: two writers at once (two `lmsp-tray open`, two threads) never
    truncate or move each other's half-written file, and a link planted at that name is never
    followed. A failure removes the temporary file and raises the OSError.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:  # a name taken (by chance, or planted): draw another
            continue
        break
    try:
        with os.fdopen(fd, "wb") as fh:
            if POSIX:
                os.fchmod(fh.fileno(), mode)  # the umask took bits at creation; the mode asked for is the one kept
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def tighten(files: Iterable[Path]) -> None:
    """An existing install made private: each of `files` that exists left 0600."""
    for file in files:
        private_file(file)


def _chmod(path: Path, mode: int) -> None:
    with contextlib.suppress(OSError):  # not ours to change (a shared mount): the service still runs
        if (path.stat().st_mode & 0o7777) != mode:
            os.chmod(path, mode)
