"""A real HTTP server on loopback for the client's tests: canned answers, every request recorded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class LocalHTTP:
    """Serves `routes` (path → answer, or a function of the request giving one); 404 for the rest."""

    routes: dict[str, Answer | Callable[[Seen], Answer]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                owner.seen.append(seen)
                route = owner.routes.get(self.path.split("?", 1)[0], (404, {}, b'{"detail":"no such path"}'))
                status, headers, body = route(seen) if callable(route) else route
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="local-http", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
