"""A grammar cannot freeze a model for everyone: compiled off the decoding thread, compact, bounded.

- Long enums compile to a prefix tree of their values (`gbnf.literal_trie`): the
  same language as the flat alternation (checked here exactly, as regular
  expressions), a fraction of its size, and few parse stacks in llama.cpp.
- Samplers with a grammar are built before the job joins the batch, never on
  the thread that decodes the other sequences (real llama.cpp, in-process).
- A 12,000-value enum over HTTP answers one of its values while another
  stream on the same model runs on unchanged (generated GGUF).
- A request whose grammar would be over `max_grammar_bytes` is a 400 that
  says the limit, on `POST /responses` and already on `POST /tasks`.
"""

from __future__ import annotations

import json
import queue
import random
import re
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import SLOW_ID, body, stream_deltas
from tools_support import PLAIN_ID, client, live_config, live_files, output_of  # noqa: F401  (pytest fixtures)

from lmsp_tray.chat.gbnf import Grammar, literal, literal_trie
from lmsp_tray.chat.schema import SchemaCompiler
from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.jobs import STOP, Finish, GenerationJob
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.engine.trigger import CallMarkers
from lmsp_tray.runner import grammars as grammars_module
from lmsp_tray.runner import scheduler as scheduler_module
from lmsp_tray.runner.model import LlamaModel, LoadOptions
from lmsp_tray.runner.runtime import Runtime
from lmsp_tray.runner.sampler import Sampler


def words(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(string.ascii_lowercase[:8]) for _ in range(rng.randint(1, 9))))
    return sorted(out)


# -- the prefix tree --------------------------------------------------------------------------------

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[()|?]|\s+')


def gbnf_to_regex(expr: str) -> str:
    """The trie's GBNF (literals, groups, `|`, `?`) as a Python regular expression."""
    out = []
    for tok in _TOKEN.findall(expr):
        if tok.startswith('"'):
            out.append(re.escape(json.loads(tok)))
        elif not tok.isspace():
            out.append(tok)
    return "".join(out)


def widest_group(expr: str) -> int:
    """The most alternatives any one group (or the whole expression) of the GBNF has."""
    counts = [1]
    widest = 1
    for tok in _TOKEN.findall(expr):
        if tok == "(":
            counts.append(1)
        elif tok == ")":
            widest = max(widest, counts.pop())
        elif tok == "|":
            counts[-1] += 1
    return max(widest, *counts)


@pytest.mark.parametrize("seed", range(5))
def test_the_prefix_tree_matches_exactly_the_values(seed: int) -> None:
    rng = random.Random(seed)
    values = words(rng.randint(1, 60), seed)
    texts = [json.dumps(v) for v in values] + ["1", "10", "100", "2"]  # bare values, some prefixes of others
    pattern = re.compile(gbnf_to_regex(literal_trie(texts)))
    for text in texts:
        assert pattern.fullmatch(text)
    for text in texts:  # every strict prefix and extension that is not a value is refused
        for cut in range(1, len(text)):
            assert bool(pattern.fullmatch(text[:cut])) == (text[:cut] in texts)
        assert bool(pattern.fullmatch(text + "x")) == (text + "x" in texts)
    assert literal_trie(['"only"']) == literal('"only"')


def test_a_12000_value_enum_compiles_to_a_compact_grammar() -> None:
    values = words(12_000)
    g = Grammar()
    rule = SchemaCompiler(g, {"enum": values}).compile()
    trie = g.text(rule)
    flat = " | ".join(literal(json.dumps(v)) for v in values)
    assert len(trie) < len(flat)
    # llama.cpp keeps one parse stack per alternative it is inside: at most one per next character
    # here (8 letters and the closing quote), where the flat alternation starts with 12,000.
    assert widest_group(g.rules[rule]) <= 9
    assert widest_group(flat) == 12_000
    pattern = re.compile(gbnf_to_regex(g.rules[rule].removesuffix(" space")))
    assert all(pattern.fullmatch(json.dumps(v)) for v in values[::97])


# -- off the decoding thread ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    from gguf_factory import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf")
    info = GGUFInfo(architecture="llama", context_length=512, block_count=2)
    entry = ModelEntry("tiny", Path(path), "custom", path.stat().st_size, (path,), info)
    loaded = LlamaModel(Runtime(), entry, LoadOptions(parallel=2, threads=1))
    yield loaded
    loaded.close()


def test_grammars_are_compiled_off_the_decoding_thread(model: LlamaModel, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[str, bool]] = []  # (thread, with a grammar)

    class Recording(Sampler):
        def __init__(self, vocab, params: SamplingParams) -> None:
            built.append((threading.current_thread().name, bool(params.grammar)))
            super().__init__(vocab, params)

    monkeypatch.setattr(scheduler_module, "Sampler", Recording)
    monkeypatch.setattr(grammars_module, "Sampler", Recording)
    values = words(12_000)
    g = Grammar()
    rule = SchemaCompiler(g, {"enum": values}).compile()
    grammar = g.text(rule)
    lazy = CallMarkers((("<tool_call>", rule),))
    out: queue.Queue = queue.Queue()
    jobs = [
        GenerationJob(model.tokenize("hello"), SamplingParams(seed=1, grammar=grammar, grammar_root=rule), 30, out.put),
        GenerationJob(
            model.tokenize("hello"), SamplingParams(seed=2, grammar=grammar), 5, out.put, grammar_trigger=lazy
        ),
        GenerationJob(model.tokenize("hello"), SamplingParams(seed=3), 5, out.put),
    ]
    for job in jobs:
        model.submit(job)
    finishes = []
    text = []
    while len(finishes) < len(jobs):
        item = out.get(timeout=120)
        if isinstance(item, Finish):
            finishes.append(item)
        elif isinstance(item, str):
            text.append(item)
    assert all(f.error is None for f in finishes), finishes
    with_grammar = [name for name, grammared in built if grammared]
    assert len(with_grammar) == 2  # the enum job's sampler and the lazy job's, ahead of time
    assert not [name for name in with_grammar if name.startswith("lmsp-model-")], built
    assert any(name.startswith("lmsp-model-") for name, grammared in built if not grammared)  # plain: there


def test_a_job_cancelled_while_its_grammar_compiles_never_runs(model: LlamaModel) -> None:
    g = Grammar()
    rule = SchemaCompiler(g, {"enum": words(12_000, seed=7)}).compile()
    out: queue.Queue = queue.Queue()
    job = GenerationJob(model.tokenize("hi"), SamplingParams(grammar=g.text(rule), grammar_root=rule), 30, out.put)
    model.submit(job)
    job.cancel()
    items = []
    while not items or not isinstance(items[-1], Finish):
        items.append(out.get(timeout=120))
    assert items[-1].reason in ("cancelled", STOP, "length")  # cancelled unless it already finished


# -- over HTTP --------------------------------------------------------------------------------------


def test_a_12000_value_enum_answers_one_value_while_another_stream_runs(client: httpx.Client, live) -> None:
    values = words(12_000, seed=3)
    schema = {"type": "object", "properties": {"pick": {"enum": values}}, "required": ["pick"]}
    other = body("the local model", model=PLAIN_ID, max_output_tokens=150, stream=True)
    alone = "".join(e.data["delta"] for e in stream_deltas(live, other))
    seen: list[str] = []
    started = threading.Event()

    def background() -> None:
        for e in stream_deltas(live, other):
            seen.append(e.data["delta"])
            started.set()

    worker = threading.Thread(target=background)
    worker.start()
    assert started.wait(60)
    request = {
        "model": PLAIN_ID,
        "input": "pick one",
        "max_output_tokens": 64,
        "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema}},
        "extensions": {"lmsp_tray": {"seed": 5}},
    }
    r = client.post("/responses", json=request)
    worker.join(120)
    assert r.status_code == 200, r.text
    [message] = list(output_of("message", r.json()))
    assert json.loads(message["content"][0]["text"])["pick"] in values
    assert "".join(seen) == alone  # the other stream ran on, unchanged


@pytest.fixture
def small_limit(daemon_factory):
    return daemon_factory(max_grammar_bytes=4096)


def test_a_grammar_over_the_limit_is_a_400_that_says_the_limit(small_limit) -> None:
    schema = {"type": "object", "properties": {"pick": {"enum": words(600, seed=9)}}}
    request = {
        "model": SLOW_ID,
        "input": "pick one",
        "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema}},
    }
    with httpx.Client(base_url=small_limit.url, timeout=60, headers=small_limit.auth_headers) as c:
        for path in ("/responses", "/tasks"):
            r = c.post(path, json=request)
            assert r.status_code == 400, r.text
            doc = r.json()
            assert doc["code"] == "invalid_request" and doc["param"] == "response_format"
            assert "the limit is 4,096 bytes" in doc["detail"] and "max_grammar_bytes" in doc["detail"]
        assert c.get(f"/models/{SLOW_ID}").json()["state"] == "available"  # refused before loading anything
        small = {**request, "text": {"format": {"type": "json_schema", "name": "p", "schema": {"enum": ["a", "b"]}}}}
        assert c.post("/responses", json=small).status_code == 200
