"""Small things a careful user notices, over real HTTP on the generated models.

- A listing shows model files' full paths (the user's home folder and name) only to a token with
  `models:manage` (the console's, the owner's); an app with `models:read` sees the file name.
- A 100 kB request URL is answered 414 before routing, not 404 with the URL echoed back.
- An answer whose reader left (the person pressed Stop) shows on Activity as stopped, with the prompt
  tokens it read and the tokens it sent, not as `in_progress` with 0 tokens.
- A `/v1` request's token figures land on its own Activity row, not on a separate "(task)" row.
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from support import SLOW_ID, TINY_ID, LiveDaemon, wait_until

pytestmark = pytest.mark.timeout(300)


def _activity(live: LiveDaemon) -> list[dict]:
    return httpx.get(live.url + "/activity", headers=live.auth_headers, timeout=30).json()["requests"]


def test_paths_only_to_tokens_that_manage_models(live: LiveDaemon, tiny_gguf: Path) -> None:
    reader = live.daemon.auth.tokens.create("reader", ["models:read"]).secret
    as_reader = {"Authorization": f"Bearer {reader}"}
    owner = httpx.get(live.url + f"/models/{TINY_ID}", headers=live.auth_headers, timeout=30).json()
    assert Path(owner["extensions"]["lmsp_tray"]["path"]).is_absolute()
    for answer in (
        httpx.get(live.url + f"/models/{TINY_ID}", headers=as_reader, timeout=30).json(),
        next(m for m in httpx.get(live.url + "/models", headers=as_reader, timeout=30).json()["data"]
             if m["id"] == TINY_ID),
    ):  # fmt: skip
        ext = answer["extensions"]["lmsp_tray"]
        assert ext["path"] == ext["file_name"] == owner["extensions"]["lmsp_tray"]["file_name"], ext
    shown = httpx.post(live.base + "/api/show", json={"model": TINY_ID}, headers=as_reader, timeout=30).json()
    assert str(tiny_gguf.parent) not in shown["modelfile"] and "/" not in shown["modelfile"].split("FROM ")[1]


def _raw_get(live: LiveDaemon, target: str) -> tuple[int, bytes]:
    """GET `target` over a plain socket (httpx refuses URLs this long): the status and the whole answer."""
    port = int(live.base.rsplit(":", 1)[1])
    head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {live.owner_token}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall((head + "Connection: close\r\n\r\n").encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def test_a_very_long_url_is_414_and_not_echoed(live: LiveDaemon) -> None:
    long = "x" * 100_000
    for target in (f"/lmsp/v1/{long}", f"/v1/models/{long}", f"/lmsp/v1/models?q={long}"):
        status, answer = _raw_get(live, target)
        assert status == 414, (target[:40], answer[:300])
        assert long[:1000].encode() not in answer and len(answer) < 2000
    assert all(len(row["endpoint"]) < 1000 for row in _activity(live))


def test_a_stopped_answer_shows_stopped_with_its_tokens(live: LiveDaemon) -> None:
    body = {"model": SLOW_ID, "input": "Tell me a long story.", "max_output_tokens": 400, "stream": True}
    with (
        httpx.Client(timeout=120, headers=live.auth_headers) as c,
        c.stream("POST", live.url + "/responses", json=body) as r,
    ):
        deltas = 0
        for line in r.iter_lines():
            if line.startswith("event: response.output_text.delta"):
                deltas += 1
                if deltas == 3:
                    break  # the person pressed Stop: the stream is closed here

    def stopped_row() -> dict | None:
        rows = [row for row in _activity(live) if row["endpoint"] == "/lmsp/v1/responses" and row["model"] == SLOW_ID]
        return rows[-1] if rows and rows[-1]["done"] and rows[-1]["outcome"] is not None else None

    row = wait_until(stopped_row, 60, "the stopped answer's row")
    assert row["outcome"] == "stopped", row
    assert row["tokens_in"] > 0 and row["tokens_out"] >= 3, row


def test_a_v1_answer_lands_on_its_own_row(live: LiveDaemon, v1: httpx.Client) -> None:
    before = {row["id"] for row in _activity(live)}
    r = v1.post(
        "/chat/completions",
        json={"model": TINY_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    new = [row for row in _activity(live) if row["id"] not in before]
    assert [row["endpoint"] for row in new] == ["/v1/chat/completions"], new
    row = new[0]
    assert (row["model"], row["status"], row["outcome"]) == (TINY_ID, 200, "completed") or row["outcome"] == (
        "incomplete"
    )
    assert (row["tokens_in"], row["tokens_out"]) == (usage["prompt_tokens"], usage["completion_tokens"])
