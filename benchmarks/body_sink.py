"""A sink for request bodies: what sending them costs the machine, without any service's work.

    python benchmarks/body_sink.py PORT

Reads each request's body to its end (`Content-Length`) and answers `400` with a small JSON body, as
lmsp-tray answers the oversized conversations `loop_stall.py` sends. `loop_stall.py --sink` sends the
same bodies here while the service decodes: the client's sending and the kernel's copying over loopback
still take their CPU, no parse does, so the gaps of that run are the floor that no service-side work
can go under on this machine.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        left = int(self.headers.get("content-length", "0"))
        while left > 0:  # read in C, a megabyte at a time: nothing parsed, nothing kept
            got = self.rfile.read(min(left, 2**20))
            if not got:
                return
            left -= len(got)
        answer = b'{"code":"sink"}'
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:  # the sink is up (`common.wait_http`)
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
