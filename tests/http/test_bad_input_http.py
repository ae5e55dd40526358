"""Bad input over real HTTP gets a 400 that names the field, never a 500 (issue 15 items 1-4, 11).

Each class is tried where it can arrive (every JSON body: responses, tasks, pairing, tokens,
settings, pulls) and beside its neighbours that must still work (a surrogate pair, an escaped
backslash, a long but finite number, `"NaN"` as a string).
"""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from support import TINY_ID, LiveDaemon, body

pytestmark = pytest.mark.shared_daemon  # the tests share the module's daemon (conftest.py)

LONE = "\\ud800"  # as it appears in JSON text: valid JSON, not Unicode
SCHEMA_PATH = "text.format.schema"


def post_raw(c: httpx.Client, path: str, text: str, **headers: str) -> httpx.Response:
    return c.post(path, content=text.encode(), headers={"Content-Type": "application/json", **headers})


def refused(r: httpx.Response, param: str | None, code: str = "invalid_request") -> dict[str, Any]:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    doc = r.json()
    assert doc["code"] == code, doc
    assert doc.get("param") == param, doc
    return doc


def with_lone(template: str) -> str:
    """A JSON body whose @ is replaced by a string holding a lone surrogate."""
    return template.replace("@", f'"a{LONE}b"')


SURROGATE_CASES = [
    # (path, JSON text with @ where the bad string goes, the param named)
    ("/responses", f'{{"model":"{TINY_ID}","input":@}}', "input"),
    ("/responses", f'{{"model":"{TINY_ID}","input":[{{"role":"user","content":@}}]}}', "input[0].content"),
    (
        "/responses",
        f'{{"model":"{TINY_ID}","input":[{{"role":"user","content":[{{"type":"input_text","text":@}}]}}]}}',
        "input[0].content[0].text",
    ),
    ("/responses", f'{{"model":"{TINY_ID}","input":"hi","instructions":@}}', "instructions"),
    (
        "/responses",
        (
            f'{{"model":"{TINY_ID}","input":[{{"type":"function_call","call_id":"c","name":"f","arguments":"{{}}"}},'
            f'{{"type":"function_call_output","call_id":"c","output":@}}]}}'
        ),
        "input[1].output",
    ),
    (
        "/responses",
        (
            f'{{"model":"{TINY_ID}","input":"hi","text":{{"format":{{"type":"json_schema","name":"x",'
            f'"schema":{{"type":"string","enum":["ok",@]}}}}}}}}'
        ),
        f"{SCHEMA_PATH}.enum[1]",
    ),
    (
        "/responses",
        f'{{"model":"{TINY_ID}","input":"hi","tools":[{{"type":"function","name":"f","description":@}}]}}',
        "tools[0].description",
    ),
    ("/responses", f'{{"model":"{TINY_ID}","input":"hi","store":true,"metadata":{{"k":@}}}}', "metadata.k"),
    ("/responses", f'{{"model":"{TINY_ID}","input":"hi","extensions":{{"lmsp_tray":{{"stop":[@]}}}}}}', None),
    ("/responses", '{"model":@,"input":"hi"}', "model"),
    ("/tasks", f'{{"model":"{TINY_ID}","input":@}}', "input"),
    ("/auth/tokens", '{"name":@,"scopes":["models:read"]}', "name"),
    ("/models/pull", '{"model":@}', "model"),
]


@pytest.mark.parametrize(("path", "template", "param"), SURROGATE_CASES)
def test_lone_surrogates_are_refused_naming_the_field(client: httpx.Client, path: str, template: str, param) -> None:
    text = with_lone(template)
    for headers in ({}, {"Idempotency-Key": "k-" + path.strip("/").replace("/", "-")}):
        r = post_raw(client, path, text, **headers)
        if param is None:  # inside extensions: the path names it whole
            param = "extensions.lmsp_tray.stop[0]"
        doc = refused(r, param)
        assert "surrogate" in doc["detail"]


def test_surrogates_in_keys_lows_and_neighbours(client: httpx.Client) -> None:
    # A lone low surrogate, and one at the end of a string, are refused too.
    for bad in ("\\udfff", "x\\udc00", "\\ud83d"):
        refused(post_raw(client, "/responses", f'{{"model":"{TINY_ID}","input":"{bad}"}}'), "input")
    # In a key: the object holding it is named.
    r = post_raw(client, "/responses", f'{{"model":"{TINY_ID}","input":"hi","metadata":{{"{LONE}":"v"}}}}')
    assert "key" in refused(r, "metadata")["detail"]
    # Neighbours that are fine: a complete pair, the character itself, an escaped backslash before 'ud800'.
    for good in ("\\ud83d\\ude00", "\U0001f600", "\\\\ud800"):
        r = post_raw(
            client,
            "/responses",
            f'{{"model":"{TINY_ID}","input":"say {good}","max_output_tokens":1,"store":true}}',
            **{"Idempotency-Key": f"good-{len(good)}"},
        )
        assert r.status_code == 200, r.text
        stored = client.get(f"/responses/{r.json()['id']}/input_items")
        assert stored.status_code == 200


@pytest.mark.shared_daemon(False)  # it changes the daemon
def test_a_pairing_name_with_a_lone_surrogate_is_never_stored(daemon: LiveDaemon, client: httpx.Client) -> None:
    r = post_raw(client, "/auth/pairings", with_lone('{"app_name":@,"scopes":["models:read"]}'))
    refused(r, "app_name")
    assert client.get("/auth/pairings").json()["data"] == []
    # Even a bad value already held (say, from an older version) cannot break the owner's listing.
    daemon.daemon.auth.pairings.request("held\ud800name", ["models:read"])
    r = client.get("/auth/pairings")
    assert r.status_code == 200
    assert r.json()["data"][0]["app_name"] == "held\ufffdname"


NUMBER_CASES = [
    # (the body's fields as JSON text, the param named)
    ('"max_output_tokens":1' + "0" * 5000, "max_output_tokens"),
    ('"temperature":1e999', "temperature"),
    ('"temperature":-1e999', "temperature"),
    ('"temperature":0.' + "1" * 80, "temperature"),
    ('"extensions":{"lmsp_tray":{"seed":' + "9" * 70 + "}}", "extensions.lmsp_tray.seed"),
    ('"text":{"format":{"type":"json_schema","schema":{"type":"integer","maximum":1e400}}}', f"{SCHEMA_PATH}.maximum"),
    ('"text":{"format":{"type":"json_schema","schema":{"enum":[1,' + "7" * 9000 + "]}}}", f"{SCHEMA_PATH}.enum[1]"),
]


@pytest.mark.parametrize(("fields", "param"), NUMBER_CASES)
def test_huge_numbers_are_refused_naming_the_field(client: httpx.Client, fields: str, param: str) -> None:
    r = post_raw(client, "/responses", f'{{"model":"{TINY_ID}","input":"hi",{fields}}}')
    doc = refused(r, param)
    assert len(r.content) < 2000, "the literal is not echoed whole"
    assert "number" in doc["detail"] or "range" in doc["detail"]


def test_large_but_finite_numbers_get_the_fields_own_answer(client: httpx.Client) -> None:
    cases = [
        ('"max_output_tokens":' + "9" * 30, "max_output_tokens", "context_length_exceeded"),
        ('"temperature":1e308', "temperature", "invalid_request"),
        ('"extensions":{"lmsp_tray":{"top_k":' + "9" * 20 + "}}", "extensions.lmsp_tray.top_k", "invalid_request"),
        ('"extensions":{"lmsp_tray":{"seed":' + "9" * 40 + "}}", "extensions.lmsp_tray.seed", "invalid_request"),
    ]
    for fields, param, code in cases:
        refused(post_raw(client, "/responses", f'{{"model":"{TINY_ID}","input":"hi",{fields}}}'), param, code)
    # A long keep-alive is a long keep-alive.
    r = client.post("/responses", json=body(max_output_tokens=1, extensions={"lmsp_tray": {"keep_alive": 1e300}}))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(client: httpx.Client, constant: str) -> None:
    cases = [
        (
            "/responses",
            f'{{"model":"{TINY_ID}","input":"hi","extensions":{{"lmsp_tray":{{"keep_alive":{constant}}}}}}}',
        ),
        ("/responses", f'{{"model":"{TINY_ID}","input":"hi","temperature":{constant}}}'),
        ("/tasks", f'{{"model":"{TINY_ID}","input":"hi","top_p":{constant}}}'),
        ("/auth/tokens", f'{{"name":"n","scopes":["models:read"],"x":[{constant}]}}'),
    ]
    params = ["extensions.lmsp_tray.keep_alive", "temperature", "top_p", "x[0]"]
    for (path, text), param in zip(cases, params, strict=True):
        doc = refused(post_raw(client, path, text), param, "invalid_json")
        assert constant in doc["detail"] and "RFC 8259" in doc["detail"]
    r = client.patch("/settings", content=f'{{"keep_alive":{constant}}}', headers={"Content-Type": "application/json"})
    refused(r, "keep_alive", "invalid_json")
    # The neighbour: the word as a string is no number either, and says so in the field's own words.
    r = client.post("/responses", json=body(extensions={"lmsp_tray": {"keep_alive": constant}}))
    refused(r, "extensions.lmsp_tray.keep_alive")


def test_wrong_shapes_are_refused(client: httpx.Client) -> None:
    cases = [
        ({"text": {"format": "json_object"}}, "text.format"),
        ({"text": "json"}, "text"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"verbosity": 3}}, "text.verbosity"),
        ({"metadata": "tag"}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"user": 42}, "user"),
        ({"truncation": True}, "truncation"),
        ({"include": "all"}, "include"),
        ({"reasoning": "high"}, "reasoning"),
        ({"max_tool_calls": 0}, "max_tool_calls"),
        ({"top_logprobs": "5"}, "top_logprobs"),
        ({"background": 1}, "background"),
        ({"extensions": {"lmsp_tray": "fast"}}, "extensions.lmsp_tray"),
    ]
    for extra, param in cases:
        refused(client.post("/responses", json={**body(), **extra}), param)
    # Their well-typed neighbours are accepted.
    ok = body(
        max_output_tokens=1,
        text_=None,
        metadata={"k": "v"},
        parallel_tool_calls=False,
        user="u",
        truncation="disabled",
        include=[],
        reasoning={"effort": "low"},
    )
    del ok["text_"]
    ok["text"] = {"format": {"type": "text"}, "verbosity": "low"}
    assert client.post("/responses", json=ok).status_code == 200


def test_echoes_are_cut(daemon: LiveDaemon, client: httpx.Client) -> None:
    huge_id = "m" * 1_000_000
    r = client.post("/responses", json=body(model=huge_id))
    assert r.status_code == 404 and r.json()["code"] == "model_not_found"
    assert len(r.content) < 1000 and "1000000 characters" in r.json()["detail"]
    for path in ("/nothing/" + "u" * 20_000, "/tasks/task_" + "t" * 20_000, "/responses/resp_" + "r" * 20_000):
        r = client.get(path)
        assert r.status_code == 404 and len(r.content) < 1000, (path[:20], r.status_code, len(r.content))
    r = client.put("/models" + "/x" * 10_000)
    assert r.status_code in (404, 405) and len(r.content) < 1000
    # A URL longer than the request-head limit is refused by the HTTP layer, also briefly.
    for size in (30_000, 100_000):  # beside and over the limit
        with socket.create_connection(("127.0.0.1", daemon.daemon.port or 0), timeout=30) as s:
            s.sendall(f"GET /lmsp/v1/{'u' * size} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(65536):  # the server lingers after refusing: no reset (http/connections.py)
                answer += chunk
        assert answer.startswith((b"HTTP/1.1 4",)) and len(answer) < 2000, answer[:300]
    # A call id quoted in a refusal.
    r = client.post(
        "/responses", json=body(input=[{"type": "function_call_output", "call_id": "c" * 100_000, "output": "o"}])
    )
    assert r.status_code == 400 and len(r.content) < 2000


def test_no_task_existence_oracle(client: httpx.Client) -> None:
    """`after=<another token's task id>` is answered as an unknown id is, as are reading and cancelling it."""
    mine = client.post("/tasks", json=body(max_output_tokens=1)).json()["id"]
    r = client.post("/auth/tokens", json={"name": "other", "scopes": ["tasks:read", "tasks:create"]})
    other = {"Authorization": f"Bearer {r.json()['secret']}"}
    unknown = "task_01J8M6Q4W2T7N5R3V9X1Z8B0DF"
    answers = []
    for task_id in (mine, unknown):
        got = [
            client.get("/tasks", params={"after": task_id}, headers=other),
            client.get(f"/tasks/{task_id}", headers=other),
            client.get(f"/tasks/{task_id}/events", headers=other),
            client.post(f"/tasks/{task_id}/cancel", headers=other),
        ]
        answers.append([(g.status_code, g.json()["code"], g.json()["detail"].replace(task_id, "ID")) for g in got])
    assert answers[0] == answers[1]
    assert answers[0][0][0] == 404
    # The owner can still page after it.
    assert client.get("/tasks", params={"after": mine}).status_code == 200


def test_a_long_input_is_validated_in_batches_with_the_right_index() -> None:
    """Past `INPUT_BATCH` items, `input` is validated a batch at a time (the GIL handed back between
    batches); a refusal still names the item by its index in the whole list."""
    from lmsp_tray.errors import LMSPError
    from lmsp_tray.protocol.requests import INPUT_BATCH, parse_response_create

    items: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(3 * INPUT_BATCH + 7)]
    assert len(parse_response_create({"model": TINY_ID, "input": items}).items) == len(items)
    for index, bad, param, code in [
        (
            2 * INPUT_BATCH + 3,
            {"role": "user", "content": [{"type": "input_text", "text": 5}]},
            "content[0].text",
            "invalid_request",
        ),
        (INPUT_BATCH, {"role": "robot", "content": "x"}, "role", "invalid_request"),
        (
            INPUT_BATCH + 1,
            {"role": "user", "content": [{"type": "input_file"}]},
            "content[0]",
            "unsupported_capability",
        ),
    ]:
        body = {"model": TINY_ID, "input": [*items[:index], bad, *items[index + 1 :]]}
        with pytest.raises(LMSPError) as info:
            parse_response_create(body)
        assert (info.value.code, info.value.param) == (code, f"input[{index}].{param}")


@pytest.mark.shared_daemon(False)  # it changes the daemon
def test_bytes_that_are_not_utf8_in_the_database_break_no_read(daemon: LiveDaemon, client: httpx.Client) -> None:
    """Whatever wrote them (another tool, an older version), such bytes read as U+FFFD, not a 500."""
    rid = client.post("/responses", json=body(max_output_tokens=1, store=True)).json()["id"]
    tid = client.post("/tasks", json=body(max_output_tokens=1)).json()["id"]
    daemon.daemon.db.write_sync(
        lambda c: c.execute("UPDATE responses SET model = CAST(X'6dff6d' AS TEXT) WHERE id = ?", (rid,))
    )
    daemon.daemon.db.write_sync(
        lambda c: c.execute(
            "UPDATE tasks SET status = status, owner = owner || CAST(X'ff' AS TEXT) WHERE id = ?", (tid,)
        )
    )
    r = client.get(f"/responses/{rid}")
    assert r.status_code == 200
    assert client.get("/tasks").status_code == 200
    assert client.get(f"/responses/{rid}/input_items").status_code == 200


def test_no_stored_response_existence_oracle(client: httpx.Client) -> None:
    """Another token's stored response answers exactly as an unknown id, however it is reached."""
    mine = client.post("/responses", json=body(max_output_tokens=1, store=True)).json()["id"]
    r = client.post("/auth/tokens", json={"name": "other", "scopes": ["responses:create", "responses:read"]})
    other = {"Authorization": f"Bearer {r.json()['secret']}"}
    unknown = "resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"
    answers = []
    for rid in (mine, unknown):
        got = [
            client.get(f"/responses/{rid}", headers=other),
            client.get(f"/responses/{rid}/input_items", headers=other),
            client.delete(f"/responses/{rid}", headers=other),
            client.post("/responses", json=body(max_output_tokens=1, previous_response_id=rid), headers=other),
            client.post("/tasks", json=body(max_output_tokens=1, previous_response_id=rid), headers=other),
        ]
        answers.append(
            [(g.status_code, g.json().get("code"), g.json().get("detail", "").replace(rid, "ID")) for g in got]
        )
    assert answers[0] == answers[1], answers
    assert client.get(f"/responses/{mine}").status_code == 200  # and it is still there for its owner
