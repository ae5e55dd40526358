"""The loopback rule: a token goes to this machine's loopback only, never through a proxy or a redirect."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from local_http import LocalHTTP

from lmsp_tray.client.loopback import NotLoopback, is_loopback, request

SERVICE_DOC = (200, {"Content-Type": "application/json"}, b'{"object": "service"}')
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture
def server() -> Iterator[LocalHTTP]:
    served = LocalHTTP({"/lmsp/v1": SERVICE_DOC})
    yield served
    served.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:7373/lmsp/v1",
        "http://127.9.8.7:1/",
        "http://[::1]:7373/v1",
        "http://localhost:7373",
        "https://LOCALHOST./",
    ],
)
def test_loopback_urls(url: str) -> None:
    assert is_loopback(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://192.0.2.1:7373/lmsp/v1",
        "http://example.com/lmsp/v1",
        "http://127.0.0.1.example.com/",
        "http://localhost.example.com/",
        "http://[::2]/",
        "http://0.0.0.0:7373/",
        "file:///etc/passwd",
        "ftp://127.0.0.1/",
        "http:///lmsp/v1",
        "http://[::1/",
        "not a url",
    ],
)
def test_other_urls_are_refused_before_anything_is_sent(url: str) -> None:
    assert not is_loopback(url)
    with pytest.raises(NotLoopback, match="not a loopback URL"):
        request("GET", url, token="tok_secret", timeout=1)


def test_no_proxy_even_when_the_environment_names_one(server: LocalHTTP, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = LocalHTTP({})
    try:
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        reply = request("GET", server.url + "/lmsp/v1", token="tok_secret", timeout=5)
    finally:
        proxy.close()
    assert reply.status == 200 and reply.json() == {"object": "service"}
    assert proxy.seen == []  # the proxy never saw the request, nor its token
    [seen] = server.seen
    assert seen.path == "/lmsp/v1" and seen.headers["authorization"] == "Bearer tok_secret"


def test_a_redirect_off_loopback_is_not_followed(server: LocalHTTP) -> None:
    server.routes["/away"] = (302, {"Location": "http://192.0.2.1:7373/lmsp/v1"}, b"")
    with pytest.raises(NotLoopback):
        request("GET", server.url + "/away", token="tok_secret", timeout=5)


def test_a_redirect_on_loopback_is_followed(server: LocalHTTP) -> None:
    server.routes["/moved"] = (307, {"Location": server.url + "/lmsp/v1"}, b"")
    reply = request("GET", server.url + "/moved", token="tok_secret", timeout=5)
    assert reply.status == 200 and [s.path for s in server.seen] == ["/moved", "/lmsp/v1"]


def test_an_error_status_is_an_answer_and_a_body_goes_as_json(server: LocalHTTP) -> None:
    problem = {"detail": "no such token", "code": "not_found"}
    server.routes["/lmsp/v1/auth/tokens/x/revoke"] = (404, {}, json.dumps(problem).encode())
    reply = request("POST", server.url + "/lmsp/v1/auth/tokens/x/revoke", {"why": "test"}, timeout=5)
    assert (reply.status, reply.doc()) == (404, problem)
    assert server.seen[0].method == "POST" and server.seen[0].headers["content-type"] == "application/json"
    assert "authorization" not in server.seen[0].headers  # no token given, none sent


def test_nothing_listening_is_an_oserror() -> None:
    closed = LocalHTTP({})
    url = closed.url
    closed.close()
    with pytest.raises(OSError):
        request("GET", url + "/lmsp/v1", timeout=5)
