"""Starting the service so that a person who clicked a launcher sees what happened.

Why a module of its own: from a terminal a failure on stderr is enough, but lmsp-tray is mostly
started from the applications menu or at login, where stderr goes nowhere. Every way a start can
end early — a second launch, a busy port, a bad `config.toml`, a damaged database, no access to
the data folder, an unexpected bug — goes through `Reporter`: one line on stderr, the log file
(`~/.cache/lmsp-tray/logs/lmsp-tray.log`, set up before anything else is read) and a desktop
notification where a notification server listens.

`claim_instance` takes the per-home lock (`lmsp_tray.instance`) before the database is opened or
the port bound, so two launches at the same moment never both serve: the loser reports
"already running" and asks the winner to show itself, whatever the winner is busy with.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

from lmsp_tray.client.finding import answers
from lmsp_tray.config import Paths
from lmsp_tray.instance import (
    SERVICE,
    InstanceInfo,
    InstanceLock,
    ShowRequests,
    ask_to_show,
    read_info,
    wait_for_url,
    write_info,
)

log = logging.getLogger("lmsp_tray.startup")

FILE_ONLY = {"file_only": True}  # log records already said on stderr: the log file only
LOCK_WAIT_S = 30.0  # a `tokens` command holds the lock for a moment; a start waits that long for it
URL_WAIT_S = 15.0  # a second launch waits this long for a starting instance to listen


class StartupError(Exception):
    """A start-up failure with a message for a person; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1, summary: str = "lmsp-tray could not start") -> None:
        super().__init__(message)
        self.code = code
        self.summary = summary


@dataclass
class Reporter:
    """Says one thing three ways: stderr, the log file, a desktop notification."""

    paths: Paths | None = None
    notifications: bool = True

    def failure(self, message: str, *, code: int = 1, summary: str = "lmsp-tray could not start") -> int:
        print(f"lmsp-tray: {message}", file=sys.stderr, flush=True)
        log.error("%s: %s", summary, message, extra=FILE_ONLY)
        self.notify(summary, message + self._log_hint(), critical=True)
        return code

    def notice(self, message: str, *, summary: str, stream: str = "stderr", notify: bool = True) -> None:
        """A one-line notice (e.g. headless, already running) on a stream, in the log and as a notification."""
        print(message, file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)
        log.info("%s", message.removeprefix("lmsp-tray: "), extra=FILE_ONLY)
        if notify:
            self.notify(summary, message.removeprefix("lmsp-tray: "))

    def notify(self, summary: str, body: str, *, critical: bool = False) -> bool:
        if not self.notifications:
            return False
        try:
            from lmsp_tray.desktop.notify import CRITICAL, NORMAL, notify_once

            return notify_once(summary, body, urgency=CRITICAL if critical else NORMAL)
        except Exception as exc:  # noqa: BLE001 - a notification is a courtesy, never a second failure
            log.debug("no notification: %s", exc)
            return False

    def _log_hint(self) -> str:
        if self.paths is None:
            return ""
        return f"\n\nDetails are in {self.paths.log_dir / 'lmsp-tray.log'}"


# -- one instance per home --------------------------------------------------------------------------


def claim_instance(paths: Paths, show: ShowRequests, wait_s: float = LOCK_WAIT_S) -> InstanceLock | InstanceInfo:
    """Our lock (we are the service now) or the info of the service that already runs.

    The show handler is installed before `instance.json` names our pid, so a second launch's
    signal never finds this process without one.
    """
    lock = InstanceLock(paths)
    deadline = time.monotonic() + wait_s
    holder: InstanceInfo | None = None
    while True:
        try:
            got = lock.acquire()
        except OSError as exc:
            raise StartupError(
                f"cannot use the data folder {paths.data_dir}: {exc.strerror or exc}. Check that it exists and "
                "belongs to you."
            ) from None
        if got:
            show.install()
            write_info(paths, SERVICE)
            return lock
        holder = read_info(paths)
        if holder is not None and holder.role == SERVICE and holder.pid != os.getpid() and holder.alive:
            return holder
        if time.monotonic() > deadline:
            who = f" (pid {holder.pid}, {holder.role})" if holder is not None else ""
            raise StartupError(
                f"the data folder {paths.data_dir} is locked by another lmsp-tray process{who} that does not "
                "finish. Wait for it or stop it, then start lmsp-tray again."
            )
        time.sleep(0.05)


def second_launch(paths: Paths, holder: InstanceInfo, reporter: Reporter, *, wait_s: float = URL_WAIT_S) -> int:
    """Another instance serves this home: say where, and ask it to show itself."""
    info = wait_for_url(paths, holder, wait_s)
    if info.url is None:
        state = "it is still starting"
    elif answers(info.url, timeout=2.0):
        state = ""
    else:
        state = "it is not answering right now (busy or paused)"
    where = f" at {info.url}" if info.url else ""
    message = f"lmsp-tray is already running{where} (pid {info.pid})" + (f"; {state}." if state else ".")
    shown = ask_to_show(info)
    if shown:
        message += " Asked it to show itself."
    # The running instance shows its menu or a notification itself; only without that way do we notify.
    reporter.notice(message, summary="lmsp-tray is already running", stream="stdout", notify=not shown)
    return 0
