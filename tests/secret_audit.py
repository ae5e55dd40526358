"""Suite-wide check that no secret leaks: at the end of the run, everything the service wrote — its
logs (captured at DEBUG) and every file under the test run's temporary folders (databases with their
WAL, discovery files, the log files of daemons run as subprocesses, caches) — is searched for secrets.

Two nets. Secrets issued in this process are recorded by wrapping `generate_secret` (API tokens
`lmsp_…` and pairing poll tokens `lmspp_…`) and must all have the shape searched for. Secrets issued
by daemons run as subprocesses are not known here, so any string of that shape in any file counts as
a leak: no file the service writes may hold a secret (the keyring holds them, outside these folders).
Model files (*.gguf) are skipped: tests write them before any secret exists.

One file is allowed to hold a secret, by design: `owner-token`, the owner token of a run without a
keyring (lmsp_tray.auth.vault.OwnerTokenFile), and only while it is private (mode 0600). A clean
exit removes it; a test that kills a service leaves it behind, as a crash would.
"""

from __future__ import annotations

import logging
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import lmsp_tray.auth.pairing
import lmsp_tray.auth.tokens

SECRET = re.compile(rb"lmspp?_[A-Za-z0-9_-]{43}")
LOGGERS = ("lmsp_tray", "uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture(scope="session", autouse=True)
def secret_audit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    issued: set[str] = set()
    original = lmsp_tray.auth.tokens.generate_secret

    def recording(prefix: str = lmsp_tray.auth.tokens.SECRET_PREFIX) -> str:
        secret = original(prefix)
        issued.add(secret)
        return secret

    root = tmp_path_factory.getbasetemp()
    log_file = root / "audit-service.log"
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = {name: logging.getLogger(name).level for name in LOGGERS}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lmsp_tray.auth.tokens, "generate_secret", recording)
        mp.setattr(lmsp_tray.auth.pairing, "generate_secret", recording)
        for name in LOGGERS:
            logging.getLogger(name).addHandler(handler)
            logging.getLogger(name).setLevel(logging.DEBUG)
        try:
            yield issued
        finally:
            for name, level in saved.items():
                logging.getLogger(name).removeHandler(handler)
                logging.getLogger(name).setLevel(level)
            handler.close()
    odd = sorted(s[:6] for s in issued if not SECRET.fullmatch(s.encode()))
    assert not odd, f"issued secrets the audit's pattern would miss: {odd}"
    leaks = find_leaks(root)
    assert not leaks, f"secrets found in files the service wrote: {sorted(leaks)}"


def find_leaks(root: Path, issued: set[str] | None = None, max_bytes: int = 64 * 1024 * 1024) -> set[str]:
    """Files under `root` holding a secret (paths relative to root): one of `issued`, or with
    `issued=None` any string shaped like a secret."""
    if issued is not None and not issued:
        return set()
    wanted = None if issued is None else {s.encode() for s in issued}
    leaks: set[str] = set()
    for path in root.rglob("*"):
        try:
            if not path.is_file() or path.is_symlink() or path.suffix == ".gguf" or path.stat().st_size > max_bytes:
                continue
            if path.name == "owner-token" and stat.S_IMODE(path.stat().st_mode) == 0o600:
                continue  # the no-keyring owner token file (see the module docstring)
            data = path.read_bytes()
        except OSError:
            continue
        if any(wanted is None or m.group(0) in wanted for m in SECRET.finditer(data)):
            leaks.add(str(path.relative_to(root)))
    return leaks
