"""Names the test, thread and lines that connected a TCP socket the garbage collector later finds unclosed.

Python's warning about an unclosed socket names only its ports, and it comes when the collector happens to
run: inside whichever later test allocates enough, often in another thread (a fake server parsing headers).
So the test that fails is a bystander, and twice the full run failed this way on a leak no run of one
folder reproduced. With this plugin the failure carries a "socket origin" section: the test that was
running when that socket connected, the thread, and the lines of this checkout (and the first library
line) that connected it. conftest.py takes `pytest_configure` from here (`-p socket_origins` elsewhere).
"""

from __future__ import annotations

import re
import socket
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support import ROOT

OURS = (f"{ROOT / 'lmsp_tray'}/", f"{ROOT / 'tests'}/")  # code objects carry absolute file names
LOCAL_PORT = re.compile(r"<socket\.socket [^>]*laddr=\('[^']*', (\d+)")


@dataclass(frozen=True)
class Origin:
    test: str
    thread: str
    lines: tuple[str, ...]

    def describe(self) -> str:
        return "\n".join([f"connected while {self.test} ran, in thread {self.thread!r}, from:", *self.lines])


def _lines() -> tuple[str, ...]:
    """The frames of this checkout that led to the connect, innermost last, with the first frame outside it
    below them (the library call that opened the socket)."""
    frames = traceback.extract_stack()[:-3]  # without _lines, _note and the patched connect
    ours = [f for f in frames if f.filename.startswith(OURS)]
    if not ours:
        return tuple(f"  {f.filename}:{f.lineno} in {f.name}" for f in frames[-6:])
    last = frames.index(ours[-1])
    shown = ours[-6:] + frames[last + 1 : last + 2]
    return tuple(f"  {f.filename}:{f.lineno} in {f.name}" for f in shown)


class SocketOrigins:
    """Remembers, per local port, where the latest TCP connection from it was made (ports are reused, so the
    newest is the one a warning about an open socket means), and adds it to a report that names the port."""

    def __init__(self) -> None:
        self.test = "(no test: collection or a session fixture)"
        self.by_port: dict[int, Origin] = {}
        self._plain = (socket.socket.connect, socket.socket.connect_ex)

    def install(self) -> None:
        plain_connect, plain_connect_ex = self._plain
        note = self._note

        def connect(sock: socket.socket, address: Any) -> None:
            try:
                plain_connect(sock, address)
            finally:
                note(sock)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            result = plain_connect_ex(sock, address)
            note(sock)
            return result

        socket.socket.connect, socket.socket.connect_ex = connect, connect_ex  # type: ignore[method-assign]

    def uninstall(self) -> None:
        socket.socket.connect, socket.socket.connect_ex = self._plain  # type: ignore[method-assign]

    def _note(self, sock: socket.socket) -> None:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        try:
            port = sock.getsockname()[1]
        except OSError:
            return
        if port:
            self.by_port[port] = Origin(self.test, threading.current_thread().name, _lines())

    def origins_in(self, text: str) -> list[tuple[int, Origin | None]]:
        return [(int(port), self.by_port.get(int(port))) for port in dict.fromkeys(LOCAL_PORT.findall(text))]

    # -- pytest's hooks ----------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.test = item.nodeid
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
        report: pytest.TestReport = yield
        if report.failed:
            found = self.origins_in(str(report.longrepr))
            if found:
                text = "\n\n".join(
                    f"port {port}: " + (origin.describe() if origin else "no connect from it was seen in this process")
                    for port, origin in found
                )
                report.sections.append(("socket origin", text))
        return report

    def pytest_unconfigure(self) -> None:
        self.uninstall()


def pytest_configure(config: pytest.Config) -> None:
    origins = SocketOrigins()
    origins.install()
    config.pluginmanager.register(origins, "socket-origins")
