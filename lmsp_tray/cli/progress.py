"""The pull's printed progress: one redrawn line on a terminal, a line every few seconds otherwise.

Why a module of its own: a pull in this process (`cli.pull`) and a pull the running service
does while the command follows it (`cli.pull_remote`) print the same plan sizes, progress line
and exit status, so neither owns the printer and neither imports the other for it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Any

INTERRUPTED = 130  # the exit status of a pull stopped by Ctrl+C (what was fetched is kept)
LINE_EVERY_S = 5.0  # progress lines when stderr is not a terminal
REDRAW_EVERY_S = 0.1


def size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if n < 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def duration(seconds: int | None) -> str:
    if seconds is None:
        return "--"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def progress_line(p: Any, width: int = 20) -> str:
    """``[#########           ]  45%  2.10 GB / 4.70 GB  35.2 MB/s  1m12s left  file.gguf``"""
    share = p.bytes_done / p.bytes_total if p.bytes_total else 1.0
    bar = "#" * int(share * width)
    if p.phase == "checking":
        what = f"checking the part already fetched ({size(p.file_bytes_done)})"
    elif p.phase == "waiting":
        what = "waiting for another download of this file"
    elif p.phase == "verifying":
        what = "verifying"
    elif p.phase == "done":
        what = "done"
    else:
        speed = f"{size(int(p.bytes_per_second))}/s" if p.bytes_per_second else "--/s"
        what = f"{speed}  {duration(p.eta_seconds)} left"
    name = os.path.basename(p.file)
    return f"[{bar:<{width}}] {share * 100:3.0f}%  {size(p.bytes_done)} / {size(p.bytes_total)}  {what}  {name}"


class Printer:
    """One redrawn line on a terminal; a line every few seconds otherwise."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._shown = ""
        self._latest: Any = None
        self._lock = threading.Lock()

    def progress(self, p: Any, *, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            self._latest = p
            if not force and now - self._last < (REDRAW_EVERY_S if self.tty else LINE_EVERY_S):
                return
            self._last = now
            line = progress_line(p)
            if self.tty:
                pad = max(0, len(self._shown) - len(line))
                self.stream.write("\r" + line + " " * pad)
                self._shown = line
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """The last progress, shown whatever the time since the previous line, then a new line."""
        if self._latest is not None:
            self.progress(dataclasses.replace(self._latest, phase="done"), force=True)
        self.end_line()

    def end_line(self) -> None:
        with self._lock:
            if self.tty and self._shown:
                self.stream.write("\n")
                self.stream.flush()
            self._shown = ""
