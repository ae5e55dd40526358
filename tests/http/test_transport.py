"""The service's TCP connections: Nagle's algorithm is off on every accepted connection.

With it on, a response written in two pieces (head, then body) on a kept-alive connection waits
for the client's delayed ACK — about 40 ms added to every request after the first. The check
reads the option on the live server's own socket (found through /proc/self/fd), not a timing.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from support import LiveDaemon

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to find the server's socket")


def accepted_socket_nodelay(server_port: int, client_port: int) -> int | None:
    """TCP_NODELAY of this process's socket serving (server_port ← client_port), None if not found."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.getsockname()[1] == server_port and sock.getpeername()[1] == client_port:
                return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        except OSError:
            continue
        finally:
            sock.close()
    return None


def ask(conn: socket.socket, host: str) -> bytes:
    conn.sendall(f"GET /lmsp/v1 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return rest


def test_kept_alive_connections_have_nagle_off(daemon: LiveDaemon) -> None:
    url = urlsplit(daemon.url)
    assert url.hostname and url.port
    with socket.create_connection((url.hostname, url.port)) as conn:
        client_port = conn.getsockname()[1]
        for _ in range(2):  # the second request rides the same connection
            assert b'"lmsp_version"' in ask(conn, url.netloc)
        assert accepted_socket_nodelay(url.port, client_port) == 1
