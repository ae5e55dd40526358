"""Running `lmsp-tray launch` as a person would, with the pairing approved through the service's API.

`launch` runs in a process of its own (its real command line, the real keyring on the test bus);
while it runs, an approver approves each pairing it asks for with the owner token over HTTP
(`POST /lmsp/v1/auth/pairings/{id}/approve`), as the tray's Approve or `tokens approve` does, and
keeps the names of the apps it approved.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from support import LiveDaemon

ROOT = Path(__file__).resolve().parent.parent
TOKEN_NAME = "{} (paired)"  # the name a paired token gets under Apps


@contextmanager
def approving(live: LiveDaemon) -> Iterator[list[str]]:
    """Approve every pairing asked for while the block runs; yields the app names approved."""
    approved: list[str] = []
    stop = threading.Event()

    def approve() -> None:
        with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=30) as client:
            while not stop.wait(0.2):
                for pairing in client.get("/auth/pairings").json()["data"]:
                    if client.post(f"/auth/pairings/{pairing['id']}/approve").status_code == 200:
                        approved.append(pairing["app_name"])

    thread = threading.Thread(target=approve, name="test-approver", daemon=True)
    thread.start()
    try:
        yield approved
    finally:
        stop.set()
        thread.join(10)


def launch_env(**extra: str) -> dict[str, str]:
    """The test's environment for `lmsp-tray launch`: this worktree's package, no display, no CLI token."""
    drop = {"DISPLAY", "WAYLAND_DISPLAY", "LMSP_TRAY_TOKEN", "LMSP_TRAY_MODEL", "ANTHROPIC_API_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_launch(
    live: LiveDaemon,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`python -m lmsp_tray launch ARGS --url <live>` with pairings approved; (the run, apps approved)."""
    with approving(live) as approved:
        run = subprocess.run(
            [sys.executable, "-m", "lmsp_tray", "launch", "--url", live.base, *args],
            env=dict(env or launch_env()),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return run, approved
