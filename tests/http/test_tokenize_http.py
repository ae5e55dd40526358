"""`POST /lmsp/v1/models/{id}/tokenize`, `/detokenize` and `/apply-template` over real HTTP.

llama-server (the same vendored llama.cpp) serves the same generated model; its `/tokenize` and
`/detokenize` answer the same tokens, pieces and text for the same inputs. The template applied
without generating is the prompt a response reads: its tokens are the response's input tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import TINY_ID, LiveDaemon, llama_server

pytestmark = pytest.mark.timeout(300)

TEXTS = ["hello world", "The cat sat on the mat.", "  spaces\tand\nnew lines  ", "émoji 🙂 and ünïcode", ""]


@pytest.fixture(scope="module")
def reference(tiny_gguf: Path) -> Iterator[str]:
    with llama_server(tiny_gguf, "-c", "256") as base:
        yield base


def _post(live: LiveDaemon, action: str, body: dict, model: str = TINY_ID) -> httpx.Response:
    return httpx.post(f"{live.url}/models/{model}/{action}", json=body, headers=live.auth_headers, timeout=60)


def test_tokens_and_text_equal_llama_server(live: LiveDaemon, reference: str) -> None:
    for text in TEXTS:
        for options in ({}, {"add_special": True}, {"with_pieces": True}, {"parse_special": False}):
            theirs = httpx.post(reference + "/tokenize", json={"content": text, **options}, timeout=30).json()
            r = _post(live, "tokenize", {"content": text, **options})
            assert r.status_code == 200, r.text
            ours = r.json()
            assert ours["model"] == TINY_ID and ours["count"] == len(ours["tokens"])
            assert ours["tokens"] == theirs["tokens"], (text, options)
        ids = _post(live, "tokenize", {"content": text}).json()["tokens"]
        theirs = httpx.post(reference + "/detokenize", json={"tokens": ids}, timeout=30).json()["content"]
        ours = _post(live, "detokenize", {"tokens": ids}).json()
        assert ours["content"] == theirs, text


def test_the_template_is_what_a_response_reads(live: LiveDaemon) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    r = _post(live, "apply-template", {"messages": messages})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "Say hello." in prompt and "Be brief." in prompt
    counted = _post(live, "tokenize", {"content": prompt, "add_special": True}).json()["count"]
    answer = httpx.post(
        live.url + "/responses",
        json={"model": TINY_ID, "input": messages, "max_output_tokens": 1, "temperature": 0},
        headers=live.auth_headers,
        timeout=60,
    ).json()
    assert answer["usage"]["input_tokens"] == counted
    bare = _post(live, "apply-template", {"messages": messages, "add_generation_prompt": False}).json()["prompt"]
    assert prompt.startswith(bare) and bare != prompt


def test_refusals_and_scope(live: LiveDaemon) -> None:
    assert _post(live, "tokenize", {"content": "hi"}, model="no-such").status_code == 404
    r = _post(live, "detokenize", {"tokens": [10**9]})
    assert r.status_code == 400 and r.json()["param"] == "tokens", r.text
    assert _post(live, "tokenize", {"text": "no content"}).status_code == 400
    assert _post(live, "apply-template", {"messages": []}).status_code == 400
    reader = live.daemon.auth.tokens.create("reader", ["models:read"]).secret
    r = httpx.post(
        f"{live.url}/models/{TINY_ID}/tokenize",
        json={"content": "hi"},
        headers={"Authorization": f"Bearer {reader}"},
        timeout=30,
    )
    assert r.status_code == 403
