"""Typed errors carrying their LMSP code and HTTP status.

Every failure a client can see is one of these. The layers that speak LMSP
raise them (serving, auth, engine, chat, protocol); the store raises its own
exceptions (`store.errors`), which `serving.storage` maps to these.
`lmsp_tray.http.problems` is the single place that turns them into RFC 9457
problem documents (and `service` turns them into terminal events once a
stream has started). Messages never contain secrets or stack traces.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DETAIL_CHARS = 1000  # a problem's detail is cut here: whatever a message quotes, an answer stays small
MAX_PARAM_CHARS = 200
MAX_QUOTE_CHARS = 80
_SURROGATE = re.compile("[\ud800-\udfff]")


def quote(value: object, limit: int = MAX_QUOTE_CHARS) -> str:
    """`value` quoted for a message: repr-style, cut to a short prefix with its full length said.

    Errors name what the client sent (a model id, a path); a client can send a megabyte of it, so
    messages quote at most `limit` characters of it, never the whole."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def _bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with any lone surrogate (unencodable) replaced by U+FFFD."""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return _SURROGATE.sub("\ufffd", text)


class LMSPError(Exception):
    """Base class: a problem with an LMSP `code`, an HTTP `status` and a title."""

    code = "internal_error"
    status = 500
    title = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        detail = _bounded(detail, MAX_DETAIL_CHARS)
        super().__init__(detail)
        self.detail = detail
        self.param = None if param is None else _bounded(param, MAX_PARAM_CHARS)
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def to_problem(self) -> dict[str, Any]:
        """The RFC 9457 problem document for this error (`message` repeats `detail` for the SDKs that read it)."""
        doc: dict[str, Any] = {
            "type": f"urn:lmsp:error:{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            # An RFC 9457 extension member: SDKs built for OpenAI-style errors show `message`, not `detail`.
            "message": self.detail,
        }
        if self.param is not None:
            doc["param"] = self.param
        doc.update(self.extra)
        return doc


class InvalidRequest(LMSPError):
    code, status, title = "invalid_request", 400, "Invalid request"


class InvalidJSON(LMSPError):
    code, status, title = "invalid_json", 400, "Malformed JSON"


class UnsupportedCapability(LMSPError):
    code, status, title = "unsupported_capability", 400, "Unsupported capability"


class ContextLengthExceeded(LMSPError):
    code, status, title = "context_length_exceeded", 400, "Context length exceeded"


class InputTooLong(ContextLengthExceeded):
    """The input alone (with room for one output token) does not fit the model's context window."""


class UnsupportedVersion(LMSPError):
    code, status, title = "unsupported_version", 400, "Unsupported LMSP version"


class Unauthorized(LMSPError):
    code, status, title = "unauthorized", 401, "Unauthorized"


class InsufficientScope(LMSPError):
    code, status, title = "insufficient_scope", 403, "Insufficient scope"


class ForbiddenHost(LMSPError):
    code, status, title = "forbidden_host", 403, "Forbidden host"


class ForbiddenOrigin(LMSPError):
    code, status, title = "forbidden_origin", 403, "Forbidden origin"


class ModelNotFound(LMSPError):
    code, status, title = "model_not_found", 404, "Model not found"


class ResponseNotFound(LMSPError):
    code, status, title = "response_not_found", 404, "Response not found"


class TaskNotFound(LMSPError):
    code, status, title = "task_not_found", 404, "Task not found"


class NotFound(LMSPError):
    code, status, title = "not_found", 404, "Not found"


class MethodNotAllowed(LMSPError):
    code, status, title = "method_not_allowed", 405, "Method not allowed"


class RequestTimeout(LMSPError):
    code, status, title = "request_timeout", 408, "Request timeout"


class RequestCancelled(LMSPError):
    """The client went away before the answer and the work was stopped; no one reads this answer
    (499, as proxies log a request whose client closed the connection)."""

    code, status, title = "request_cancelled", 499, "Request cancelled"


class Conflict(LMSPError):
    code, status, title = "conflict", 409, "Conflict"


class IdempotencyKeyInProgress(LMSPError):
    code, status, title = "idempotency_key_in_progress", 409, "Idempotency key in progress"


class EventHistoryExpired(LMSPError):
    code, status, title = "event_history_expired", 410, "Event history expired"


class PayloadTooLarge(LMSPError):
    code, status, title = "payload_too_large", 413, "Payload too large"


class UriTooLong(LMSPError):
    code, status, title = "uri_too_long", 414, "URI too long"


class IdempotencyKeyReused(LMSPError):
    code, status, title = "idempotency_key_reused", 422, "Idempotency key reused"


class TooManyRequests(LMSPError):
    code, status, title = "too_many_requests", 429, "Too many requests"


class InternalError(LMSPError):
    code, status, title = "internal_error", 500, "Internal error"


class ModelLoadFailed(LMSPError):
    code, status, title = "model_load_failed", 503, "Model load failed"


class ServiceUnavailable(LMSPError):
    code, status, title = "service_unavailable", 503, "Service unavailable"


class ModelCrashed(LMSPError):
    """The process running a model died (a file changed under it, llama.cpp aborted, out of memory);
    the service and the other models keep running, and the next request loads the model again."""

    code, status, title = "model_crashed", 503, "Model crashed"


class ServiceRestarted(LMSPError):
    code, status, title = "service_restarted", 500, "Service restarted"


class InsufficientMemory(LMSPError):
    code, status, title = "insufficient_memory", 507, "Insufficient memory"


class InsufficientStorage(LMSPError):
    """A disk is full: what was asked to be kept (the service's data, a download) was not, or would not fit."""

    code, status, title = "insufficient_storage", 507, "Insufficient storage"


def _classes() -> dict[str, type[LMSPError]]:
    found: dict[str, type[LMSPError]] = {}
    todo: list[type[LMSPError]] = [LMSPError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


def error_from_problem(problem: dict[str, Any], *, headers: dict[str, str] | None = None) -> LMSPError:
    """The error a problem document describes (how a model process reports one to the service)."""
    known = ("type", "title", "status", "detail", "code", "param", "message")
    cls = _classes().get(str(problem.get("code") or ""), InternalError)
    return cls(
        str(problem.get("detail") or "The model failed."),
        param=problem.get("param"),
        headers=headers,
        extra={k: v for k, v in problem.items() if k not in known},
    )
