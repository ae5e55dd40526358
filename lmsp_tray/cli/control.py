"""`lmsp-tray stop`: end the running instance of this home the way Quit does.

Why: an icon without a menu (pystray's xorg backend), a headless service started from a
terminal that is gone, and `uninstall.sh` (which must not leave a tray running from a deleted
venv) all need a documented way to stop lmsp-tray other than `kill`. The service's pid comes from
the per-home lock's `instance.json`; SIGTERM makes it end open streams with a terminal event,
unload the models and remove its discovery file; the command waits until the lock is free.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from lmsp_tray.config import Paths
from lmsp_tray.instance import lock_is_held, service_holder


def cmd_stop(paths: Paths, args: argparse.Namespace) -> int:
    holder = service_holder(paths)
    if holder is None:
        print("lmsp-tray is not running.", file=sys.stderr)
        return 0
    try:
        os.kill(holder.pid, signal.SIGTERM)
    except ProcessLookupError:
        print("lmsp-tray is not running.", file=sys.stderr)
        return 0
    except OSError as exc:
        print(f"lmsp-tray: cannot stop pid {holder.pid}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + max(float(args.timeout), 0.0)
    while lock_is_held(paths):
        if time.monotonic() > deadline:
            print(
                f"lmsp-tray: pid {holder.pid} did not stop within {args.timeout:.0f} s; it may still be finishing "
                "open streams.",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)
    where = f" at {holder.url}" if holder.url else ""
    print(f"stopped lmsp-tray{where} (pid {holder.pid}).", file=sys.stderr)
    return 0
