"""The API's locks, tried from outside over a real socket: tokens and scopes, Host, Origin, size limits."""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest
from support import TINY_ID, LiveDaemon, body

from lmsp_tray.auth.tokens import SCOPES
from lmsp_tray.http.api import PUBLIC
from lmsp_tray.http.app import LMSP

pytestmark = pytest.mark.shared_daemon  # the tests share the module's daemon (conftest.py)

REALM = 'Bearer realm="lmsp"'

# Every endpoint that needs a token: (method, path under /lmsp/v1, JSON body, scope).
ENDPOINTS = [
    ("GET", "/models", None, "models:read"),
    ("GET", f"/models/{TINY_ID}", None, "models:read"),
    ("POST", f"/models/{TINY_ID}/load", None, "models:manage"),
    ("POST", f"/models/{TINY_ID}/unload", None, "models:manage"),
    ("POST", "/models/pull", {"model": "not a model name"}, "models:manage"),  # 400 once allowed: no download
    ("PATCH", f"/models/{TINY_ID}/settings", {"top_p": 9}, "models:manage"),  # 400 once allowed: nothing written
    ("DELETE", "/models/no-such-model", None, "models:manage"),  # 404 once allowed: nothing deleted
    ("GET", "/hub/models", None, "models:manage"),  # 400 once allowed (no search): no request to the Hub
    ("GET", "/hub/variants", None, "models:manage"),
    ("POST", "/responses", body(max_output_tokens=1), "responses:create"),
    ("POST", f"/models/{TINY_ID}/tokenize", {"content": "hi"}, "responses:create"),
    ("POST", f"/models/{TINY_ID}/detokenize", {"tokens": [1]}, "responses:create"),
    (
        "POST",
        f"/models/{TINY_ID}/apply-template",
        {"messages": [{"role": "user", "content": "hi"}]},
        "responses:create",
    ),
    ("GET", "/responses/resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF", None, "responses:read"),
    ("DELETE", "/responses/resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF", None, "responses:create"),
    ("POST", "/tasks", body(max_output_tokens=1), "tasks:create"),
    ("GET", "/tasks", None, "tasks:read"),
    ("GET", "/tasks/task_01J8M6Q4W2T7N5R3V9X1Z8B0DF", None, "tasks:read"),
    ("GET", "/tasks/task_01J8M6Q4W2T7N5R3V9X1Z8B0DF/events", None, "tasks:read"),
    ("POST", "/tasks/task_01J8M6Q4W2T7N5R3V9X1Z8B0DF/cancel", None, "tasks:create"),
    ("GET", "/auth/tokens", None, "tokens:manage"),
    ("POST", "/auth/tokens", {"name": "from-table", "scopes": ["models:read"]}, "tokens:manage"),
    ("POST", "/auth/tokens/tok_01J8M6Q4W2T7N5R3V9X1Z8B0DF/revoke", None, "tokens:manage"),
    ("GET", "/auth/pairings", None, "tokens:manage"),
    ("POST", "/auth/pairings/BCDF-GHJK/approve", None, "tokens:manage"),
    ("POST", "/auth/pairings/BCDF-GHJK/deny", None, "tokens:manage"),
    ("POST", "/auth/pairings/dismiss", None, "tokens:manage"),
    ("GET", "/responses/resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF/input_items", None, "responses:read"),
    ("POST", "/console/codes", None, "tokens:manage"),
    ("POST", "/console/reveal", {"model": TINY_ID}, "models:manage"),
    ("GET", "/activity", None, "activity:read"),
    ("GET", "/settings", None, "settings:manage"),
    ("PATCH", "/settings", {"keep_alive": "10m"}, "settings:manage"),
]
PUBLIC_ENDPOINTS = [
    ("GET", ""),
    ("GET", "/"),
    ("GET", "/openapi.json"),
    ("POST", "/auth/pairings"),
    ("GET", "/auth/pairings/pair_01J8M6Q4W2T7N5R3V9X1Z8B0DF"),
    ("POST", "/console/sessions"),
]


def test_every_route_declares_its_scopes_and_is_called_below() -> None:
    """Each method of each route names a scope; the table-driven test below calls each non-public one."""
    for method, path, scope in LMSP.endpoints():
        assert scope == PUBLIC or scope in SCOPES, (method, path, scope)
        sample = re.sub(r"\{[^}]+\}", "x", path)
        assert LMSP.required_scope(method, sample) == scope, (method, path)  # the route the router picks
        if method == "GET":
            assert LMSP.required_scope("HEAD", sample) == scope
        served = {(m, p) for m, p, *_ in [*ENDPOINTS, *PUBLIC_ENDPOINTS] if m == method}
        called = [p for m, p in served if LMSP.route_for(m, "/lmsp/v1" + p) is LMSP.route_for(method, sample)]
        if scope == PUBLIC:
            assert called, f"public {method} {path} is not listed in PUBLIC_ENDPOINTS"
        else:
            assert called, f"{method} {path} is missing from ENDPOINTS"
            assert all(e[3] == scope for e in ENDPOINTS if e[0] == method and e[1] in called)
    # Paths no route serves: None, i.e. any valid token, then 404 / 405 from the router.
    assert LMSP.required_scope("GET", "/lmsp/v1/nothing") is None
    assert LMSP.required_scope("PUT", "/lmsp/v1/models") is None
    assert LMSP.required_scope("GET", "/elsewhere") is None


def _token(c: httpx.Client, *scopes: str, name: str = "t") -> tuple[str, str]:
    r = c.post("/auth/tokens", json={"name": name, "scopes": list(scopes)})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["secret"]


def _call(live: LiveDaemon, method: str, path: str, payload: object, auth: str | None) -> httpx.Response:
    headers = {} if auth is None else {"Authorization": auth}
    return httpx.request(method, live.url + path, json=payload, headers=headers, timeout=60)


@pytest.mark.shared_daemon(False)  # it changes the daemon
def test_every_endpoint_by_credential(daemon: LiveDaemon, client: httpx.Client) -> None:
    """no token / wrong token / malformed / revoked / token without the scope / token with it."""
    revoked_id, revoked = _token(client, *SCOPES)
    assert client.post(f"/auth/tokens/{revoked_id}/revoke").status_code == 200
    with_scope = {s: _token(client, s)[1] for s in SCOPES}
    without_scope = {s: _token(client, *(o for o in SCOPES if o != s))[1] for s in SCOPES}
    problems = []
    for method, path, payload, scope in ENDPOINTS:
        for label, auth in [
            ("no token", None),
            ("wrong token", "Bearer lmsp_" + "A" * 43),
            ("not bearer", "Basic dXNlcjpwYXNz"),
            ("bare scheme", "Bearer"),
            ("revoked", f"Bearer {revoked}"),
        ]:
            r = _call(daemon, method, path, payload, auth)
            if (r.status_code, r.headers.get("www-authenticate"), r.json().get("code")) != (401, REALM, "unauthorized"):
                problems.append((method, path, label, r.status_code, r.text[:200]))
        r = _call(daemon, method, path, payload, f"Bearer {without_scope[scope]}")
        want = f'Bearer error="insufficient_scope", scope="{scope}"'
        if (r.status_code, r.headers.get("www-authenticate"), r.json().get("code")) != (
            403,
            want,
            "insufficient_scope",
        ):
            problems.append((method, path, "without scope", r.status_code, r.text[:200]))
        r = _call(daemon, method, path, payload, f"Bearer {with_scope[scope]}")
        if r.status_code in (401, 403) or r.status_code >= 500:
            problems.append((method, path, "with scope", r.status_code, r.text[:200]))
    assert problems == []


def test_public_endpoints_need_no_token(daemon: LiveDaemon) -> None:
    assert httpx.get(daemon.url, timeout=30).json()["object"] == "service"
    assert httpx.get(daemon.url + "/", timeout=30).status_code == 200
    assert httpx.get(daemon.url + "/openapi.json", timeout=30).json()["openapi"].startswith("3.1")
    # Unknown paths are not a way around the token.
    r = httpx.get(daemon.url + "/no/such/thing", timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"] == REALM
    r = httpx.get(daemon.base + "/elsewhere", timeout=30)
    assert r.status_code == 401


def test_revocation_takes_effect_on_the_next_request(client: httpx.Client, daemon: LiveDaemon) -> None:
    token_id, secret = _token(client, "models:read")
    auth = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(daemon.url + "/models", headers=auth, timeout=30).status_code == 200
    assert client.post(f"/auth/tokens/{token_id}/revoke").json()["revoked_at"] is not None
    r = httpx.get(daemon.url + "/models", headers=auth, timeout=30)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    listed = {t["id"]: t for t in client.get("/auth/tokens").json()["data"]}
    assert listed[token_id]["revoked_at"] is not None
    assert listed[token_id]["last_used_at"] is not None


def test_owner_token_cannot_be_revoked_over_http(client: httpx.Client, daemon: LiveDaemon) -> None:
    owner_id = daemon.daemon.auth.tokens.owner_id
    r = client.post(f"/auth/tokens/{owner_id}/revoke")
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    assert client.get("/models").status_code == 200


def test_tools_execute_is_never_granted(client: httpx.Client) -> None:
    for scopes in (["tools:execute"], ["models:read", "tools:execute"]):
        r = client.post("/auth/tokens", json={"name": "x", "scopes": scopes})
        assert r.status_code == 400 and r.json()["code"] == "invalid_request" and r.json()["param"] == "scopes"
        r = client.post("/auth/pairings", json={"app_name": "x", "scopes": scopes})
        assert r.status_code == 400 and r.json()["param"] == "scopes"
    assert "tools:execute" not in client.get("").json()["auth"]["scopes"]
    for bad in ([], "models:read", ["models:write"], [1]):
        assert client.post("/auth/tokens", json={"name": "x", "scopes": bad}).status_code == 400


def test_token_listing_never_shows_secrets(client: httpx.Client, daemon: LiveDaemon) -> None:
    _, secret = _token(client, "models:read")
    text = client.get("/auth/tokens").text
    assert secret not in text and daemon.owner_token not in text
    for record in daemon.daemon.auth.tokens.tokens():
        assert record.secret_hash not in text
    assert all(
        set(t) == {"id", "object", "name", "scopes", "created_at", "last_used_at", "revoked_at", "owner"}
        for t in client.get("/auth/tokens").json()["data"]
    )


def test_token_in_query_string_is_not_accepted(daemon: LiveDaemon) -> None:
    r = httpx.get(daemon.url + "/models", params={"access_token": daemon.owner_token}, timeout=30)
    assert r.status_code == 401


# -- Host (DNS rebinding) -------------------------------------------------------------------------
def raw(
    live: LiveDaemon, head: str, body: bytes = b"", *, read_timeout: float = 30
) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (no client fixing up Host), read the whole answer."""
    port = int(live.url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as s:
        s.sendall(head.encode("latin-1") + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return parse_response(data)


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, rest


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",
        "attacker.example:7373",
        "127.0.0.1.attacker.example",
        "localhost.attacker.example",
        "127.0.0.1.nip.io",
        "127.0.0.2",
        "0.0.0.0",
        "localhost.",
        "[::1].example",
        "127.0.0.1:",
        "127.0.0.1:99999",
        "127.0.0.1:80:80",
        "[::1",
        "",
    ],
)
def test_foreign_host_is_forbidden(daemon: LiveDaemon, host: str) -> None:
    for path in ("/lmsp/v1", "/lmsp/v1/models"):
        status, headers, data = raw(
            daemon,
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
            f"{daemon.owner_token}\r\nConnection: close\r\n\r\n",
        )
        assert status == 403, (host, status, data)
        assert json.loads(data)["code"] == "forbidden_host"
        assert headers["content-type"] == "application/problem+json"


def test_missing_or_doubled_host_is_forbidden(daemon: LiveDaemon) -> None:
    status, _, data = raw(daemon, "GET /lmsp/v1 HTTP/1.0\r\n\r\n")  # HTTP/1.0 may omit Host
    assert status == 403 and json.loads(data)["code"] == "forbidden_host"
    status, _, data = raw(
        daemon, "GET /lmsp/v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"
    )
    assert status in (400, 403)  # h11 refuses two Host headers itself; either way nothing is served
    assert b'"service"' not in data


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}"]
)
def test_loopback_hosts_are_served(daemon: LiveDaemon, host: str) -> None:
    port = daemon.url.split(":")[2].split("/")[0]
    status, _, data = raw(
        daemon, f"GET /lmsp/v1 HTTP/1.1\r\nHost: {host.format(port=port)}\r\nConnection: close\r\n\r\n"
    )
    assert status == 200 and json.loads(data)["object"] == "service"


# -- Origin and CORS -----------------------------------------------------------------------------
@pytest.mark.parametrize("origin", ["http://attacker.example", "null", "http://127.0.0.1", "http://localhost:3000"])
def test_foreign_origin_is_forbidden_and_no_cors_by_default(daemon: LiveDaemon, origin: str) -> None:
    r = httpx.get(daemon.url + "/models", headers={**daemon.auth_headers, "Origin": origin}, timeout=30)
    assert r.status_code == 403 and r.json()["code"] == "forbidden_origin"
    assert not any(k.lower().startswith("access-control-") for k in r.headers)
    r = httpx.options(
        daemon.url + "/models", headers={"Origin": origin, "Access-Control-Request-Method": "GET"}, timeout=30
    )
    assert r.status_code == 403 and not any(k.lower().startswith("access-control-") for k in r.headers)
    ok = httpx.get(daemon.url + "/models", headers=daemon.auth_headers, timeout=30)
    assert ok.status_code == 200 and not any(k.lower().startswith("access-control-") for k in ok.headers)


def test_configured_origin_gets_exact_cors(daemon_factory) -> None:
    live = daemon_factory(allowed_origins=["http://localhost:3000"])
    origin = "http://localhost:3000"
    r = httpx.options(
        live.url + "/responses",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=30,
    )
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == origin
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "access-control-allow-credentials" not in r.headers
    r = httpx.get(live.url + "/models", headers={**live.auth_headers, "Origin": origin}, timeout=30)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == origin and r.headers["vary"] == "Origin"
    assert "*" not in r.headers["access-control-allow-origin"]
    # A page on that origin can read why it was refused.
    r = httpx.get(live.url + "/models", headers={"Origin": origin}, timeout=30)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin
    assert "www-authenticate" in r.headers["access-control-expose-headers"].lower()
    # Other origins stay out, even with a valid token.
    r = httpx.get(live.url + "/models", headers={**live.auth_headers, "Origin": "http://localhost:3001"}, timeout=30)
    assert r.status_code == 403 and r.json()["code"] == "forbidden_origin"
    assert "access-control-allow-origin" not in r.headers
    # Streams keep flowing through the CORS wrapper.
    with httpx.stream(
        "POST",
        live.url + "/responses",
        json=body(max_output_tokens=3, stream=True),
        headers={**live.auth_headers, "Origin": origin},
        timeout=60,
    ) as s:
        assert s.headers["access-control-allow-origin"] == origin
        assert "event: response.incomplete" in s.read().decode()


# -- size and nesting limits ---------------------------------------------------------------------
def test_oversized_bodies_are_refused_and_service_goes_on(daemon_factory) -> None:
    live = daemon_factory(max_request_bytes=4096)
    auth = live.auth_headers
    big = {"model": TINY_ID, "input": "x" * 5000}
    r = httpx.post(live.url + "/responses", json=big, headers=auth, timeout=30)  # declared Content-Length
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"

    def chunks():
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    r = httpx.post(
        live.url + "/responses", content=chunks(), headers={**auth, "Content-Type": "application/json"}, timeout=30
    )  # chunked: counted while reading
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    r = httpx.post(live.url + "/auth/pairings", json={"app_name": "x" * 5000, "scopes": ["models:read"]}, timeout=30)
    assert r.status_code == 413  # also where no token is needed
    r = httpx.post(live.url + "/responses", json=big, timeout=30)
    assert r.status_code == 401  # no token: refused before the body matters
    r = httpx.post(live.url + "/responses", json=body(max_output_tokens=2), headers=auth, timeout=60)
    assert r.status_code == 200


def test_body_limit_is_enforced_before_the_body_ends(daemon_factory) -> None:
    """A chunked body over the limit is answered 413 while the client is still sending."""
    live = daemon_factory(max_request_bytes=4096)
    port = int(live.url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            (
                f"POST /lmsp/v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                f"{live.owner_token}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            ).encode()
        )
        chunk = b"[" * 1000
        for _ in range(8):  # 8000 bytes sent, the body never ends
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        data = b""
        while b"\r\n\r\n" not in data or b"payload_too_large" not in data:
            got = s.recv(65536)
            if not got:
                break
            data += got
    status, _, rest = parse_response(data)
    assert status == 413 and b"payload_too_large" in rest


def test_deep_nesting_is_refused(client: httpx.Client) -> None:
    for depth in (65, 5000):
        nested = "[" * depth + "]" * depth
        r = client.post(
            "/responses",
            content=f'{{"model":"{TINY_ID}","input":{nested}}}',
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
        assert "nested" in r.json()["detail"]
    nested = '{"a":' * 3000 + "1" + "}" * 3000
    r = client.post("/auth/tokens", content=nested, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert client.post("/responses", json=body(max_output_tokens=2)).status_code == 200


def test_header_limit(daemon: LiveDaemon) -> None:
    """A request head over 32 KiB is refused by the HTTP layer (400), without a 5xx; the service goes on."""
    status, _, _ = raw(
        daemon, "GET /lmsp/v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + "a" * 40_000 + "\r\nConnection: close\r\n\r\n"
    )
    assert status == 400
    many = "".join(f"X-H{i}: {'v' * 60}\r\n" for i in range(1000))
    status, _, _ = raw(daemon, f"GET /lmsp/v1 HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}Connection: close\r\n\r\n")
    assert status == 400
    # A head that keeps growing without ending is cut off by h11 instead of being buffered.
    status, _, _ = raw(daemon, "GET /lmsp/v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: " + "a" * 100_000)
    assert status == 400
    status, _, _ = raw(
        daemon, "GET /lmsp/v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Ok: " + "a" * 8000 + "\r\nConnection: close\r\n\r\n"
    )
    assert status == 200
    assert httpx.get(daemon.url + "/models", headers=daemon.auth_headers, timeout=30).status_code == 200


def test_problem_documents_do_not_echo_credentials(daemon: LiveDaemon) -> None:
    wrong = "lmsp_" + "Q" * 43
    texts = []
    for auth in (f"Bearer {wrong}", f"Bearer {wrong} extra", f"Basic {wrong}"):
        r = httpx.get(daemon.url + "/models", headers={"Authorization": auth}, timeout=30)
        texts.append(r.text + json.dumps(dict(r.headers)))
    assert all(wrong not in t for t in texts)


def test_every_answer_carries_the_version(daemon_factory) -> None:
    """`LMSP-Version: 1.0` on routes, streams, errors, and the security layer's own refusals and preflights."""
    live = daemon_factory(allowed_origins=["http://localhost:3000"], max_request_bytes=4096)
    auth = live.auth_headers
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
    made = httpx.post(live.url + "/auth/tokens", json={"name": "reader", "scopes": ["models:read"]}, headers=auth)
    reader = {"Authorization": f"Bearer {made.json()['secret']}"}
    answers = {
        "service document": httpx.get(live.url, timeout=30),
        "401": httpx.get(live.url + "/models", timeout=30),
        "403 scope": httpx.post(live.url + f"/models/{TINY_ID}/load", headers=reader, timeout=30),
        "403 host": httpx.get(live.url, headers={"Host": "evil.example"}, timeout=30),
        "403 origin": httpx.get(live.url, headers={"Origin": "http://evil.example"}, timeout=30),
        "preflight": httpx.options(live.url + "/responses", headers=preflight, timeout=30),
        "400 version": httpx.get(live.url, headers={"LMSP-Version": "2.0"}, timeout=30),
        "404": httpx.get(live.url + "/nothing", headers=auth, timeout=30),
        "405": httpx.put(live.url + "/models", headers=auth, timeout=30),
        "413": httpx.post(live.url + "/responses", json={"input": "x" * 5000}, headers=auth, timeout=30),
        "stream": httpx.post(live.url + "/responses", json=body(max_output_tokens=2, stream=True), headers=auth),
    }
    assert answers["preflight"].status_code == 204 and answers["stream"].status_code == 200
    assert answers["403 scope"].json()["code"] == "insufficient_scope"
    missing = {name: r.status_code for name, r in answers.items() if r.headers.get("lmsp-version") != "1.0"}
    assert missing == {}
