"""Reading what a person types to name a model on Hugging Face.

The forms other tools taught people, all accepted:

- ``hf.co/<org>/<repo>[:<quant>]`` (Ollama; ``huggingface.co/…`` too),
- ``<org>/<repo>[:<quant>]`` (llama.cpp's ``-hf``),
- ``<org>/<repo>/<path/to/file.gguf>`` (one file, folders allowed),
- a full URL ``https://huggingface.co/<org>/<repo>/resolve/<revision>/<path>``
  (``/blob/`` — the page of the file — works as well; a repository page URL
  names the repository).

A quantization tag is matched case-insensitively (``:q4_k_m``); ``:latest``
means "the default", as in Ollama. URLs on another host are refused unless
that host is the configured endpoint (``HF_ENDPOINT``, a mirror).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from lmsp_tray.errors import InvalidRequest

DEFAULT_REVISION = "main"
HUB_HOSTS = frozenset({"huggingface.co", "hf.co", "www.huggingface.co"})
# Hugging Face repository names: letters, digits, '-', '_', '.'; no '--' or '..'; at most 96 characters.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_QUANT = re.compile(r"[A-Za-z0-9_.-]{1,40}")


@dataclass(frozen=True)
class HubRef:
    """A model named on the Hub: a repository, and either a quantization, one file, or neither (the default)."""

    repo_id: str
    quant: str | None = None  # upper case, e.g. "Q4_K_M"
    filename: str | None = None  # a path inside the repository
    revision: str = DEFAULT_REVISION

    def __str__(self) -> str:
        if self.filename:
            return f"{self.repo_id}/{self.filename}"
        return f"hf.co/{self.repo_id}" + (f":{self.quant}" if self.quant else "")


def parse_ref(text: str, *, endpoint: str | None = None, param: str = "model") -> HubRef:
    """The `HubRef` for `text`; `InvalidRequest` with a message saying what is accepted otherwise."""
    raw = text.strip() if isinstance(text, str) else ""
    if not raw:
        raise _invalid("Name a model on Hugging Face, e.g. hf.co/org/repo:Q4_K_M.", param)
    if "://" in raw:
        return _from_url(raw, endpoint, param)
    lowered = raw.lower()
    for prefix in ("hf.co/", "huggingface.co/", "www.huggingface.co/"):
        if lowered.startswith(prefix):
            raw = raw[len(prefix) :]
            break
    parts = raw.split("/")
    if len(parts) < 2:
        raise _invalid(f"'{text.strip()}' is not a Hugging Face model name; use org/repo[:QUANT].", param)
    if len(parts) == 2:
        repo, _, quant = parts[1].partition(":")
        return HubRef(_repo_id(parts[0], repo, text, param), _quant(quant, text, param))
    path = "/".join(parts[2:])
    if not path.lower().endswith(".gguf"):
        raise _invalid(
            f"'{text.strip()}' names a file that is not a .gguf model; use org/repo/file.gguf or org/repo[:QUANT].",
            param,
        )
    return HubRef(_repo_id(parts[0], parts[1], text, param), filename=_path(path, text, param))


def _from_url(raw: str, endpoint: str | None, param: str) -> HubRef:
    url = urlsplit(raw)
    host = (url.hostname or "").lower()
    allowed = set(HUB_HOSTS)
    if endpoint:
        allowed.add((urlsplit(endpoint).hostname or "").lower())
    if url.scheme not in ("http", "https") or host not in allowed:
        raise _invalid(f"'{raw}' is not a Hugging Face URL (https://huggingface.co/org/repo/…).", param)
    parts = [unquote(p) for p in url.path.split("/") if p]
    if parts and parts[0] in ("models", "api"):
        parts = parts[1:] if parts[0] == "models" else parts
    if len(parts) < 2:
        raise _invalid(f"'{raw}' does not name a repository (https://huggingface.co/org/repo).", param)
    repo_id = _repo_id(parts[0], parts[1], raw, param)
    if len(parts) == 2:
        return HubRef(repo_id)
    kind = parts[2]
    if kind in ("tree",) and len(parts) >= 4:
        return HubRef(repo_id, revision=parts[3])
    if kind not in ("resolve", "blob") or len(parts) < 5:
        raise _invalid(
            f"'{raw}' is not a file URL; copy the link of the .gguf file "
            "(https://huggingface.co/org/repo/resolve/main/file.gguf).",
            param,
        )
    path = "/".join(parts[4:])
    if not path.lower().endswith(".gguf"):
        raise _invalid(f"'{raw}' links a file that is not a .gguf model.", param)
    return HubRef(repo_id, filename=_path(path, raw, param), revision=parts[3])


def _repo_id(org: str, repo: str, text: str, param: str) -> str:
    for name in (org, repo):
        if not _NAME.fullmatch(name) or "--" in name or ".." in name:
            raise _invalid(
                f"'{text.strip()}' does not name a Hugging Face repository: '{name}' is not a valid "
                "organization or repository name.",
                param,
            )
    return f"{org}/{repo}"


def _quant(quant: str, text: str, param: str) -> str | None:
    if not quant or quant.lower() == "latest":
        return None
    if not _QUANT.fullmatch(quant):
        raise _invalid(f"'{quant}' in '{text.strip()}' is not a quantization tag such as Q4_K_M.", param)
    return quant.upper()


def _path(path: str, text: str, param: str) -> str:
    segments = path.split("/")
    if any(s in ("", ".", "..") for s in segments) or "\\" in path or "\x00" in path:
        raise _invalid(f"'{text.strip()}' has an unusable file path.", param)
    return path


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)
