"""A local stand-in for the Hugging Face Hub and its CDN, for download tests (nothing reaches the internet).

It serves the three shapes `huggingface_hub` and lmsp-tray's `hub.remote` use:

- ``GET /api/models/<org>/<repo>[/revision/<rev>]?blobs=true``: the model info
  (``sha``, ``gated``, ``siblings`` with ``size``, ``blobId`` and ``lfs``
  {``sha256``, ``size``, ``pointerSize``});
- ``HEAD|GET /<org>/<repo>/resolve/<rev>/<path>``: an LFS file answers ``302``
  to the CDN with ``X-Repo-Commit``, ``X-Linked-Etag`` (its SHA-256),
  ``X-Linked-Size`` and ``ETag``; a small file answers ``200`` itself. Errors
  carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``, ``GatedRepo`` with 401 without a token, 403 with a token
  that was not granted access);
- the CDN, on another port (another origin, like the real one): ``GET
  /cdn/<sha256>`` honouring ``Range`` (``206`` + ``Content-Range``).

Tests steer the CDN per file: `cut_at` (close the connection after a byte
offset, once), `flip` (serve one byte altered), `pause_at` (stop at an offset
until released), `ignore_range`; and read what it did: `served` (body bytes
sent per file), `cdn_auth` (Authorization headers the CDN received — there
must be none) and `log`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

from support import wait_until

CHUNK = 16 * 1024


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    granted: set[str] = field(default_factory=set)  # tokens with access to a gated repo
    small: set[str] = field(default_factory=set)  # paths stored in git itself, not LFS
    downloads: int = 0  # what the Hub's search reports (`/api/models?search=`)
    likes: int = 0
    last_modified: str = "2026-01-15T10:00:00.000Z"

    @property
    def commit(self) -> str:
        h = hashlib.sha1(self.repo_id.encode())
        for path in sorted(self.files):
            h.update(path.encode() + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()

    def blob_id(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Pause:
    offset: int
    release: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)


class FakeHub:
    """The Hub on one loopback port, its CDN on another; `endpoint` is what HF_ENDPOINT should be."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.by_sha: dict[str, tuple[FakeRepo, str]] = {}
        self.served: Counter[str] = Counter()  # "<repo>/<path>" -> body bytes the CDN sent
        self.downloaded: Counter[str] = Counter()  # the same, for open-ended requests only (not header reads)
        self.cdn_auth: list[str] = []
        self.hub_auth: list[str | None] = []
        self.log: list[tuple[str, str, str]] = []  # (server, method, path + range)
        self.searches: list[dict[str, str]] = []  # the query of each model search (`/api/models?search=`)
        self.cut_at: dict[str, list[int]] = {}
        self.flip: dict[str, int] = {}
        self.pause_at: dict[str, Pause] = {}
        self.ignore_range: set[str] = set()
        self.lock = threading.Lock()
        self.sending = 0  # CDN bodies being sent now
        self._hub = _Server(("127.0.0.1", 0), _HubHandler, self)
        self._cdn = _Server(("127.0.0.1", 0), _CdnHandler, self)
        for server in (self._hub, self._cdn):
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_repo(self, repo_id: str, files: dict[str, bytes], **kw: Any) -> FakeRepo:
        repo = FakeRepo(repo_id, dict(files), **kw)
        self.repos[repo_id] = repo
        for path in repo.files:
            self.by_sha[repo.sha256(path)] = (repo, path)
        return repo

    def pause(self, key: str, offset: int) -> Pause:
        pause = self.pause_at[key] = Pause(offset)
        return pause

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Until the CDN sends no body (e.g. a cancelled client's connection has been noticed as gone)."""

        def idle() -> bool:
            with self.lock:
                return self.sending == 0

        try:
            return wait_until(idle, timeout, "the CDN to send nothing")
        except AssertionError:
            return False

    def close(self) -> None:
        for pause in self.pause_at.values():
            pause.release.set()
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, hub: FakeHub) -> None:
        super().__init__(address, handler)
        self.hub = hub


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *_: Any) -> None:
        pass

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(
            status,
            body,
            {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message, **(extra or {})},
        )


class _HubHandler(_Base):
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        with self.hub.lock:
            self.hub.log.append(("hub", self.command, path))
            self.hub.hub_auth.append(self.headers.get("Authorization"))
        if path == "/api/models":
            return self._search(parse_qs(url.query))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(m.group(1), m.group(2))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3))
        self._error(404, "NotFound", "no such endpoint")

    def _search(self, query: dict[str, list[str]]) -> None:
        """The Hub's model search as huggingface_hub's `HfApi.list_models` calls it: `search` (a substring of
        the id, any case), `filter` (tags), `sort` (with `direction=-1`: highest first), `limit`."""
        with self.hub.lock:
            self.hub.searches.append({k: v[-1] for k, v in query.items()})
        text = query.get("search", [""])[-1].lower()
        tags = set(query.get("filter", []))
        found = [r for r in self.hub.repos.values() if text in r.repo_id.lower() and tags <= {"gguf"}]
        key = query.get("sort", [""])[-1]
        if key in ("downloads", "likes"):
            found.sort(key=lambda r: getattr(r, key), reverse=query.get("direction", ["-1"])[-1] == "-1")
        limit = int(query.get("limit", ["1000"])[-1])
        docs = [
            {
                "_id": hashlib.sha1(r.repo_id.encode()).hexdigest()[:24],
                "id": r.repo_id,
                "modelId": r.repo_id,
                "likes": r.likes,
                "downloads": r.downloads,
                "tags": ["gguf"],
                "library_name": "gguf",
                "private": False,
                "lastModified": r.last_modified,
                "createdAt": "2025-06-01T00:00:00.000Z",
            }
            for r in found[:limit]
        ]
        self._send(200, json.dumps(docs).encode(), {"Content-Type": "application/json"})

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
        return repo

    def _revision_ok(self, repo: FakeRepo, rev: str | None) -> bool:
        if rev in (None, "main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", "Invalid rev id")
        return False

    def _info(self, repo_id: str, rev: str | None) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._revision_ok(repo, rev):
            return
        siblings = []
        for path, data in sorted(repo.files.items()):
            if path in repo.small:
                siblings.append({"rfilename": path, "size": len(data), "blobId": repo.blob_id(path)})
            else:
                siblings.append(
                    {
                        "rfilename": path,
                        "size": len(data),
                        "blobId": hashlib.sha1(path.encode()).hexdigest(),
                        "lfs": {"sha256": repo.sha256(path), "size": len(data), "pointerSize": 134},
                    }
                )
        doc = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": repo.commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": ["gguf"],
            "siblings": siblings,
        }
        self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._revision_ok(repo, rev):
            return
        if repo.gated:
            auth = self.headers.get("Authorization")
            token = auth.removeprefix("Bearer ") if auth else None
            if token is None:
                return self._error(401, "GatedRepo", "Access to this model is restricted. You must be authenticated.")
            if token not in repo.granted:
                return self._error(
                    403, "GatedRepo", "Access to this model is restricted and you are not in the authorized list."
                )
        data = repo.files.get(path)
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
        common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if path in repo.small:
            headers = {**common, "ETag": f'"{repo.blob_id(path)}"', "Content-Type": "application/octet-stream"}
            return self._send(200, data, headers)
        sha = repo.sha256(path)
        headers = {
            **common,
            "ETag": f'"{hashlib.sha1(path.encode()).hexdigest()}"',
            "X-Linked-Etag": f'"{sha}"',
            "X-Linked-Size": str(len(data)),
            "Location": f"{self.hub.cdn}/cdn/{sha}?expires=9999999999&signature=fake",
        }
        self._send(302, b"", headers)


class _CdnHandler(_Base):
    def do_HEAD(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        hub = self.hub
        url = urlsplit(self.path)
        m = re.fullmatch(r"/cdn/([0-9a-f]{64})", url.path)
        found = hub.by_sha.get(m.group(1)) if m else None
        auth = self.headers.get("Authorization")
        with hub.lock:
            hub.log.append(("cdn", self.command, f"{url.path} {self.headers.get('Range', '')}".strip()))
            if auth:
                hub.cdn_auth.append(auth)
        if found is None:
            return self._send(404, b"no such object")
        repo, path = found
        key = f"{repo.repo_id}/{path}"
        data = repo.files[path]
        if key in hub.flip:
            at = hub.flip[key]
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        start, end = 0, len(data) - 1
        status = 200
        bounded = False
        range_header = self.headers.get("Range")
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", "ETag": f'"{m.group(1)}"'}
        if range_header and key not in hub.ignore_range:
            rm = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header.strip())
            if rm is None:
                return self._send(400, b"bad range")
            start = int(rm.group(1))
            end = min(int(rm.group(2)), len(data) - 1) if rm.group(2) else len(data) - 1
            bounded = bool(rm.group(2))
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        body = data[start : end + 1]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = None
        with hub.lock:
            cuts = hub.cut_at.get(key)
            if cuts and not bounded:  # downloads, not header reads
                upcoming = [c for c in cuts if start < c <= end]
                if upcoming:
                    cut = min(upcoming)
                    cuts.remove(cut)
        pause = None if bounded else hub.pause_at.get(key)  # downloads pause, header reads do not
        pos = start
        with hub.lock:
            hub.sending += 1
        try:
            while pos <= end:
                if pause is not None and pos >= pause.offset and not pause.release.is_set():
                    self.wfile.flush()
                    pause.reached.set()
                    while not pause.release.wait(0.05):
                        if _peer_closed(self.connection):
                            return
                limit = end + 1
                if cut is not None:
                    limit = min(limit, cut)
                if pause is not None and not pause.release.is_set() and pos < pause.offset:
                    limit = min(limit, pause.offset)
                n = min(CHUNK, limit - pos)
                if n <= 0:
                    break
                self.wfile.write(data[pos : pos + n])
                with hub.lock:
                    hub.served[key] += n
                    if not bounded:
                        hub.downloaded[key] += n
                pos += n
                if cut is not None and pos >= cut:
                    break
            self.wfile.flush()
            if cut is not None and pos < end + 1:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with hub.lock:
                hub.sending -= 1


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the client has gone (a readable socket with nothing to read)."""
    import select

    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
