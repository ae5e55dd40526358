"""What can go wrong getting a model, as typed errors with an LMSP code and a message for a person.

The HTTP layer turns them into problem documents (`POST /models/pull`) and a
download task's terminal event carries the same document; the CLI prints the
detail. New codes, beside the profile's: `repository_not_found` (404),
`file_not_found` (404: no such file or quantization in the repository),
`gated_repository` (403: a licence to accept first, or no access to a private
repository; the problem carries ``license_url``), `hub_unavailable`
(502: the Hub could not be reached or answered oddly) and
`verification_failed` (502: the file that arrived is not the one the Hub
describes; the partial file has been deleted). None of these messages ever
holds a token. A disk too small for a download is the service's one
`lmsp_tray.errors.InsufficientStorage` (507 `insufficient_storage`, carrying
``required_bytes``, ``available_bytes`` and ``path``), so one `except` catches
a full disk wherever it was met.
"""

from __future__ import annotations

from lmsp_tray.errors import LMSPError


class RepositoryNotFound(LMSPError):
    code, status, title = "repository_not_found", 404, "Repository not found"


class HubFileNotFound(LMSPError):
    code, status, title = "file_not_found", 404, "File not found in the repository"


class GatedRepository(LMSPError):
    code, status, title = "gated_repository", 403, "Access to the repository is restricted"


class HubUnavailable(LMSPError):
    code, status, title = "hub_unavailable", 502, "Hugging Face unavailable"


class VerificationFailed(LMSPError):
    code, status, title = "verification_failed", 502, "Download verification failed"


class DownloadCancelled(Exception):
    """The pull was cancelled (Ctrl+C, `POST /tasks/{id}/cancel`, shutdown); the partial file is kept."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason
