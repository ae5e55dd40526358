"""An API mounted under one path: its routes, the scope each method of each route needs, its error shape.

Why: the scope an endpoint needs belongs next to the endpoint — as Starlette's
`requires()` puts it — not in a table of path patterns kept in step by hand.
Each route of an `Api` is a `Scoped` route naming, per method, the scope it
needs (`PUBLIC`: none)::

    Scoped("/tasks", tasks, GET="tasks:read", POST="tasks:create")

The security layer asks the API which scope a request needs
(`Api.required_scope`) before any route runs, and answers 401 / 403 in the
API's own error shape (`ErrorShape`); the exception handlers use the same
shape for the API's other errors. `/lmsp/v1` answers with RFC 9457 problem
documents; an OpenAI-compatible `/v1` would be one more `Api`, with its own
routes, scopes and OpenAI's error object, next to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount, Route

from lmsp_tray.errors import LMSPError

PUBLIC = ""  # the scope of endpoints anyone on the machine may call


class ErrorShape(Protocol):
    """How an API writes an error on the wire."""

    def encode(self, error: LMSPError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Status, raw headers and body (for pure ASGI code, e.g. the security layer)."""
        ...

    def response(self, error: LMSPError) -> Response:
        """The same as a Starlette response (for exception handlers)."""
        ...


class Scoped(Route):
    """A route that says which scope each of its methods needs: ``Scoped(path, endpoint, GET="models:read")``."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **scopes: str) -> None:
        assert scopes, "name the scope of at least one method (PUBLIC for none)"
        super().__init__(path, endpoint, methods=list(scopes))
        self.scopes = {method.upper(): scope for method, scope in scopes.items()}

    def scope_for(self, method: str) -> str | None:
        return self.scopes.get("GET" if method == "HEAD" else method)


class Api:
    """Routes mounted under `prefix`, with their scopes and the API's error shape."""

    def __init__(
        self, prefix: str, routes: Sequence[Scoped], *, errors: ErrorShape, bare: Callable[..., Any] | None = None
    ) -> None:
        self.prefix = prefix.rstrip("/")
        self.routes = list(routes)
        self.errors = errors
        self.bare = bare  # serves the prefix without its trailing slash (default: the route serving `/`)

    def starlette_routes(self) -> list[BaseRoute]:
        """One `Mount` for the prefix, and a route for the bare prefix with the scopes of the root `/`."""
        mount = Mount(self.prefix, routes=self.routes)
        root = self.route_for("GET", self.prefix + "/")
        if root is None:
            return [mount]
        return [Route(self.prefix, self.bare or root.endpoint, methods=sorted(root.methods or ())), mount]

    def owns(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")

    def route_for(self, method: str, path: str) -> Scoped | None:
        """The route that serves this request (the router's choice: the first whose path and method match)."""
        if not self.owns(path):
            return None
        probe = {"type": "http", "method": method, "path": path[len(self.prefix) :] or "/"}
        for route in self.routes:
            if route.matches(probe)[0] is Match.FULL:
                return route
        return None

    def required_scope(self, method: str, path: str) -> str | None:
        """`PUBLIC`, the scope this request needs, or None when no route serves it (then any valid token;
        the router answers 404 or 405)."""
        route = self.route_for(method, path)
        return None if route is None else route.scope_for(method)

    def endpoints(self) -> list[tuple[str, str, str]]:
        """Every (method, full path, scope) this API serves, HEAD aside."""
        return [(m, self.prefix + r.path, s) for r in self.routes for m, s in r.scopes.items()]


class PathsApi(Api):
    """An `Api` whose few routes carry their full paths and which owns exactly those paths (e.g. the
    root `/rerank` that llama-server also serves, beside `/v1/rerank`)."""

    def owns(self, path: str) -> bool:
        return any(route.path == path for route in self.routes)

    def starlette_routes(self) -> list[BaseRoute]:
        return list(self.routes)


def api_for(apis: Sequence[Api], path: str) -> Api:
    """The API a path belongs to; paths outside every API get the first one's errors."""
    return next((api for api in apis if api.owns(path)), apis[0])
