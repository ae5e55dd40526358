"""Talking to the Hugging Face Hub, through ``huggingface_hub``: listings, file locations, byte ranges.

Why through the library: it knows the endpoint (``HF_ENDPOINT`` for mirrors
and tests), where the user's token lives (``HF_TOKEN``, else the file ``hf
auth login`` writes) and the Hub's error headers, which it turns into typed
exceptions (`translate` makes them messages a person can act on). The token
is only ever put in the ``Authorization`` header of requests to the Hub
itself: a file's bytes come from the CDN the Hub redirects to, and that
request carries no token (the redirect URL is signed). Nothing here logs a
header.

Only the listing (``GET /api/models/<repo>[/revision/<rev>]?blobs=true``),
the file's metadata (``HEAD /<repo>/resolve/<commit>/<path>``, redirects
within the Hub followed) and ranged ``GET``s of the location it gives are
used, so a local server with those three shapes stands in for the Hub in tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from lmsp_tray.errors import LMSPError
from lmsp_tray.hub.errors import GatedRepository, HubFileNotFound, HubUnavailable, RepositoryNotFound
from lmsp_tray.hub.variants import RemoteFile

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger("lmsp_tray.hub")
DEFAULT_ENDPOINT = "https://huggingface.co"

# huggingface_hub (and its HTTP client) load on the first call that talks to the Hub, not with the
# service: an idle service never pays for them (about 0.3 s and 10 MB).

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0  # a stalled body raises after this long, and the transfer resumes
SEARCH_TIMEOUT_S = 10.0  # a search a person waits for in the console


@dataclass(frozen=True)
class RepoListing:
    """A repository at one commit: its files with sizes and hashes."""

    repo_id: str
    revision: str  # what was asked ("main", a tag, a commit)
    commit: str  # the commit it resolved to: every file is fetched at this one
    files: tuple[RemoteFile, ...]
    gated: bool = False


@dataclass(frozen=True)
class Location:
    """Where a file's bytes are, and what the Hub says they are."""

    url: str
    etag: str  # the cache's blob name: the SHA-256 of an LFS file, else the git blob id
    size: int | None
    commit: str | None
    on_hub: bool  # the URL is the Hub's own (the token may go along); False for the CDN
    repo_id: str = ""
    path: str = ""


class RangeNotSatisfiable(Exception):
    """The server has nothing from the asked offset on (the partial file is already whole, or too long)."""


class RetryLater(Exception):
    """A refusal that may pass: the Hub busy (429, 5xx) or a signed download URL that expired."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the download server answered HTTP {status}")
        self.status = status


class HubClient:
    """The Hub at `endpoint` (default: ``HF_ENDPOINT``, else huggingface.co)."""

    def __init__(self, endpoint: str | None = None, *, token: str | bool | None = None) -> None:
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self._token = token  # None: the user's own, where huggingface_hub keeps it

    # -- metadata -------------------------------------------------------------------------------
    def listing(self, repo_id: str, revision: str = "main") -> RepoListing:
        """The repository's files at `revision`, with sizes and LFS hashes."""
        from huggingface_hub import HfApi

        try:
            info = HfApi(endpoint=self.endpoint, token=self._token).model_info(
                repo_id, revision=revision, files_metadata=True, timeout=READ_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message for a person
            raise self.translate(exc, repo_id, revision=revision) from None
        files = tuple(
            RemoteFile(
                path=s.rfilename,
                size=int(s.lfs.size if s.lfs else (s.size or 0)),
                sha256=(s.lfs.sha256 if s.lfs else None),
                blob_id=s.blob_id,
            )
            for s in (info.siblings or [])
        )
        commit = info.sha or revision
        return RepoListing(repo_id, revision, commit, files, gated=bool(info.gated))

    def search(self, text: str, *, limit: int) -> list[Any]:
        """GGUF repositories whose name holds `text`, most downloaded first: the Hub's model search
        (`/api/models` with the parameters `HfApi.list_models` sends) through huggingface_hub's own session
        and headers, so `HF_ENDPOINT` and the user's token apply. One request, no retries: `list_models`
        retries a refused connection for ~23 s while a person waits on the console. Its `ModelInfo`s."""
        from huggingface_hub import ModelInfo
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        try:
            answer = get_session().get(
                f"{self.endpoint}/api/models",
                params={"search": text, "filter": "gguf", "sort": "downloads", "limit": limit},
                headers=build_hf_headers(token=self._token),
                timeout=SEARCH_TIMEOUT_S,
            )
            hf_raise_for_status(answer)
            return [ModelInfo(**{"siblings": None, **item}) for item in answer.json()[:limit]]
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message for a person
            raise self.translate(exc, text) from None

    def locate(self, repo_id: str, commit: str, path: str) -> Location:
        """The file's download location and metadata (a gated repository without access fails here)."""
        from huggingface_hub import get_hf_file_metadata

        url = f"{self.endpoint}/{repo_id}/resolve/{quote(commit, safe='')}/{quote(path)}"
        try:
            meta = get_hf_file_metadata(url, token=self._token, endpoint=self.endpoint, timeout=READ_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            raise self.translate(exc, repo_id, path=path) from None
        if not meta.etag:
            raise HubUnavailable(f"{self.endpoint} gave no ETag for {repo_id}/{path}; it does not look like the Hub.")
        return Location(
            url=meta.location,
            etag=meta.etag,
            size=meta.size,
            commit=meta.commit_hash,
            on_hub=_origin(meta.location) == _origin(self.endpoint),
            repo_id=repo_id,
            path=path,
        )

    # -- bytes ----------------------------------------------------------------------------------
    def _headers(self, location: Location, start: int, end: int | None = None) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=self._token) if location.on_hub else build_hf_headers(token=False)
        headers["Accept-Encoding"] = "identity"
        if start > 0 or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end}"
        return headers

    @contextlib.contextmanager
    def open(self, location: Location, start: int = 0) -> Iterator[tuple[bool, httpx2.Response]]:
        """A streamed GET from byte `start`: yields (whether the server honoured the range, response)."""
        import httpx2
        from huggingface_hub.utils import get_session

        timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        with get_session().stream(
            "GET", location.url, headers=self._headers(location, start), timeout=timeout, follow_redirects=True
        ) as response:
            if response.status_code == 416:
                raise RangeNotSatisfiable(location.url)
            if response.status_code >= 400:
                response.read()
                self._refused(response, location)
            ranged = response.status_code == 206
            if ranged and not response.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
                raise HubUnavailable("The download server answered another byte range than the one asked for.")
            yield ranged or start == 0, response

    def read_range(self, location: Location, start: int, end: int) -> bytes:
        """Bytes [start, end] (inclusive) of the file, e.g. to read a GGUF header before downloading."""
        import httpx2
        from huggingface_hub.utils import get_session

        timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        response = get_session().get(
            location.url, headers=self._headers(location, start, end), timeout=timeout, follow_redirects=True
        )
        if response.status_code >= 400:
            self._refused(response, location)
        data = response.content
        if response.status_code == 200:  # the server ignored the range
            data = data[start : end + 1]
        return data

    def _refused(self, response: httpx2.Response, location: Location) -> None:
        from huggingface_hub.utils import hf_raise_for_status

        status = response.status_code
        if status in (408, 429) or status >= 500 or (not location.on_hub and status in (401, 403, 404, 410)):
            raise RetryLater(status)
        try:
            hf_raise_for_status(response)
        except Exception as exc:  # noqa: BLE001
            raise self.translate(exc, location.repo_id, path=location.path) from None
        raise HubUnavailable(f"The download server answered HTTP {status}.")

    # -- errors ---------------------------------------------------------------------------------
    def licence_url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    def logged_in(self) -> bool:
        if self._token is False:
            return False
        if isinstance(self._token, str):
            return True
        from huggingface_hub import get_token

        try:
            return get_token() is not None
        except Exception:  # noqa: BLE001 - a broken token file: not logged in, as far as we can tell
            return False

    def translate(
        self, exc: BaseException, repo_id: str, *, path: str | None = None, revision: str | None = None
    ) -> LMSPError:
        """A failure of a Hub call as an error a person can act on (never with the token in it)."""
        import httpx2
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            OfflineModeIsEnabled,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        if isinstance(exc, LMSPError):
            return exc
        page = self.licence_url(repo_id)
        status = _status(exc)
        if isinstance(exc, GatedRepoError):
            if status == 401 or not self.logged_in():
                detail = (
                    f"{repo_id} is a gated model: open {page}, accept its licence while logged in to Hugging "
                    "Face, then log in here with `hf auth login` (or set HF_TOKEN) and pull again."
                )
            else:
                detail = (
                    f"Your Hugging Face account has no access to {repo_id} yet: open {page} and accept its licence "
                    "(some authors approve requests by hand), then pull again."
                )
            return GatedRepository(detail, param="model", extra={"license_url": page, "repository": repo_id})
        if isinstance(exc, RevisionNotFoundError):
            return HubFileNotFound(f"{repo_id} has no revision '{revision}'.", param="model")
        if isinstance(exc, RemoteEntryNotFoundError):
            return HubFileNotFound(f"{repo_id} has no file {path}.", param="model")
        if isinstance(exc, RepositoryNotFoundError):
            hint = (
                "if it is private, make sure your Hugging Face account can see it"
                if self.logged_in()
                else "if it is private, log in with `hf auth login` (or set HF_TOKEN) first"
            )
            return RepositoryNotFound(
                f"There is no model repository {repo_id} on Hugging Face ({self.endpoint}), or you cannot see it: "
                f"check the name at {page}; {hint}.",
                param="model",
            )
        if isinstance(exc, OfflineModeIsEnabled):
            return HubUnavailable("HF_HUB_OFFLINE is set: downloads from Hugging Face are turned off.")
        if isinstance(exc, HfHubHTTPError) or status is not None:
            return HubUnavailable(f"Hugging Face ({self.endpoint}) answered HTTP {status}; try again later.")
        if isinstance(exc, (httpx2.TransportError, OSError)):
            return HubUnavailable(
                f"Could not reach Hugging Face at {self.endpoint} ({_reason(exc)}); check the network."
            )
        log.warning("unexpected failure talking to %s: %s", self.endpoint, type(exc).__name__)
        return HubUnavailable(f"Talking to Hugging Face at {self.endpoint} failed ({type(exc).__name__}).")


def interrupt(response: httpx2.Response) -> None:
    """Break a streamed response's connection from another thread (a blocked read returns at once)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    else:
        response.close()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return (parts.scheme, (parts.hostname or "").lower(), port)


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]
