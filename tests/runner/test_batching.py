"""Continuous batching is correct: batched output equals solo output, streams never mix, cancel is local."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from pathlib import Path

import httpx
from generation import GREEDY, entry_for
from support import SLOW_ID, SSE, TINY_ID, LiveDaemon, body, events, iter_sse, stream_deltas, wait_until

from lmsp_tray.engine.jobs import GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.runner.batch import even_drafts, micro_batches
from lmsp_tray.runner.model import LlamaModel
from lmsp_tray.runner.runtime import Runtime

PROMPTS = ["hello world", "the local model", "a test of the stream", "weather in the city"]


def run_stream(
    live: LiveDaemon, prompt: str, tokens: int, model: str = TINY_ID, seed: int | None = None, temperature: float = 0.0
) -> tuple[str, list[SSE]]:
    extra = {"extensions": {"lmsp_tray": {"seed": seed}}} if seed is not None else {}
    with (
        httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c,
        c.stream(
            "POST",
            "/responses",
            json=body(prompt, model=model, max_output_tokens=tokens, stream=True, temperature=temperature, **extra),
        ) as r,
    ):
        evs = events(r)
    text = "".join(e.data["delta"] for e in evs if e.event == "response.output_text.delta")
    return text, evs


def test_batched_equals_alone(daemon_factory) -> None:
    # The slower model: four 40-token runs of the tiny one can finish before the next client has
    # connected on a busy machine, and then nothing overlaps.
    tokens = 64
    live = daemon_factory(parallel=4)
    alone = {p: run_stream(live, p, tokens, model=SLOW_ID)[0] for p in PROMPTS}
    barrier = threading.Barrier(len(PROMPTS))

    def together(p: str) -> str:
        barrier.wait()
        return run_stream(live, p, tokens, model=SLOW_ID)[0]

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = dict(zip(PROMPTS, pool.map(together, PROMPTS)))
    assert batched == alone
    # They really shared decode steps: fewer steps than four runs one after another would take.
    assert live.scheduler(SLOW_ID).steps < 4 * tokens * 2


def test_sampled_output_with_seed_is_reproducible_in_a_batch(daemon_factory) -> None:
    live = daemon_factory(parallel=4)
    alone = run_stream(live, PROMPTS[0], 30, seed=1234, temperature=1.0)[0]
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(run_stream, live, PROMPTS[i % 4], 30, TINY_ID, 1234 if i == 0 else 99 + i, 1.0)
            for i in range(4)
        ]
        texts = [f.result()[0] for f in futures]
    assert texts[0] == alone


def test_interleaved_streams_never_mix(daemon_factory) -> None:
    live = daemon_factory(parallel=4)
    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: run_stream(live, p, 60), PROMPTS))
    for text, evs in results:
        rid = evs[0].data["response_id"]
        item = evs[1].data["item"]["id"]
        assert all(e.data["response_id"] == rid for e in evs)
        assert all(e.data["item_id"] == item for e in evs if e.event == "response.output_text.delta")
        assert [e.id for e in evs] == list(range(1, len(evs) + 1))
        assert evs[-1].data["response"]["output"][0]["content"][0]["text"] == text
        assert evs[-1].data["usage"]["output_tokens"] == 60


def test_cancelling_one_sequence_leaves_the_others_unchanged(daemon_factory) -> None:
    live = daemon_factory(parallel=4)
    others = PROMPTS[1:]
    alone = {p: run_stream(live, p, 200, model=SLOW_ID)[0] for p in others}
    started = threading.Event()

    def cancelled_one() -> None:
        with (
            httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c,
            c.stream(
                "POST", "/responses", json=body(PROMPTS[0], model=SLOW_ID, max_output_tokens=3000, stream=True)
            ) as r,
        ):
            n = 0
            for e in iter_sse(r):
                if isinstance(e, SSE) and e.event == "response.output_text.delta":
                    started.set()
                    n += 1
                    if n == 30:
                        return  # hang up mid-generation while the others run

    with cf.ThreadPoolExecutor(4) as pool:
        victim = pool.submit(cancelled_one)
        started.wait(60)
        batched = dict(zip(others, pool.map(lambda p: run_stream(live, p, 200, model=SLOW_ID)[0], others)))
        victim.result()
    assert batched == alone


def test_short_request_is_not_starved_by_a_long_one(daemon_factory) -> None:
    """With a long generation running, a short request joins the batch and finishes long before it."""
    live = daemon_factory(parallel=2)
    first_delta = threading.Event()
    order: list[str] = []

    def long_one() -> None:
        for _ in stream_deltas(live, body(model=SLOW_ID, max_output_tokens=1500, stream=True)):
            first_delta.set()
        order.append("long")

    worker = threading.Thread(target=long_one)
    worker.start()
    assert first_delta.wait(60)
    _text, evs = run_stream(live, PROMPTS[1], 5, model=SLOW_ID)
    order.append("short")
    worker.join(300)
    assert evs[-1].data["usage"]["output_tokens"] == 5
    assert order == ["short", "long"]


def test_newcomer_prompt_is_chunked_so_running_streams_keep_flowing(daemon_factory) -> None:
    """A long prompt arriving while a stream runs is evaluated in chunks, each decoded together with
    the running stream's next token — never as one big batch that would stall the stream. The model
    process reports the size of each recent decode batch."""
    live = daemon_factory(parallel=2)
    started = threading.Event()
    done = threading.Event()

    def stream_a() -> None:
        for _ in stream_deltas(live, body(model=SLOW_ID, max_output_tokens=3000, stream=True)):
            started.set()
            if done.is_set():
                return

    worker = threading.Thread(target=stream_a)
    worker.start()
    assert started.wait(60)
    model = live.daemon.models.get(SLOW_ID)
    assert model is not None
    before = model.stats().steps
    long_prompt = "the local model service " * 60  # ~1440 tokens with the tiny vocabulary
    with httpx.Client(base_url=live.url, timeout=300, headers=live.auth_headers) as c:
        r = c.post("/responses", json=body(long_prompt, model=SLOW_ID, max_output_tokens=2))
        assert r.status_code == 200, r.text
    stats = model.stats(batches=True)
    done.set()
    worker.join(300)
    batches = list(stats.batch_sizes)[-(stats.steps - before) :]
    prompt_tokens = r.json()["usage"]["input_tokens"]
    mixed = [n for n in batches if n > 1]  # steps carrying part of the newcomer's prompt
    assert prompt_tokens > 1000
    assert max(mixed) <= 256 + 1  # a chunk plus the running stream's token
    assert sum(n - 1 for n in mixed) >= prompt_tokens - 1  # the whole prompt went through in those chunks
    assert len(mixed) >= prompt_tokens // 256


def test_micro_batches_are_the_runs_of_consecutive_sequence_ids() -> None:
    assert micro_batches([]) == 0
    assert [micro_batches(ids) for ids in ([0], [0, 1, 2, 3], [2, 0, 1], [0, 2], [0, 1, 3], [1, 3, 5, 6])] == [
        1,
        1,
        1,
        2,
        2,
        3,
    ]


def test_drafts_sharing_a_step_are_cut_to_one_length() -> None:
    """llama.cpp takes equal token counts of each sequence into a micro-batch (a KV stream each): one
    draft length a step keeps a shared step to one pass where every sequence drafts, two where some do
    not. The length feeds the most tokens a pass."""
    everyone = even_drafts({0: [1, 2, 3, 4], 1: [5, 6], 2: [7, 8, 9]})
    assert everyone == {0: [1, 2], 1: [5, 6], 2: [7, 8]}  # all draft: the shortest, one pass
    copy = list(range(100, 162))
    assert even_drafts({0: copy, 1: [5, 6]}) == {0: copy, 1: ()}  # a passage copied beside a short guess
    assert even_drafts({0: [5, 6, 7, 8]}) == {0: [5, 6, 7, 8]}  # alone: as drafted
    assert even_drafts({0: [1, 2], 1: [3, 4], 2: []}) == {0: [1, 2], 1: [3, 4], 2: []}
    assert even_drafts({}) == {}


def test_a_newcomer_takes_the_free_slot_that_keeps_the_running_sequences_together(slow_gguf: Path) -> None:
    """llama.cpp decodes sequences 0, 1, 2 in one pass and 0, 2, 3 in two (a KV stream per sequence): a
    request that finds slots 1 and 3 free, neither holding any of its prompt, takes 1, though 3 was used
    less recently (never)."""
    model = LlamaModel(Runtime(), entry_for(slow_gguf), LoadOptions(threads=1, parallel=4, speculative=False))
    prompts = [list(range(first, first + 24)) for first in (10, 50, 90, 130)]  # no token in common
    jobs = [GenerationJob(prompt, GREEDY, 3000, lambda item: None) for prompt in prompts]
    try:
        scheduler = model.scheduler
        assert scheduler is not None
        for job in jobs[:3]:
            model.submit(job)
        wait_until(lambda: scheduler.running() == [0, 1, 2], timeout=60)
        jobs[1].cancel()
        wait_until(lambda: scheduler.running() == [0, 2], timeout=60)
        model.submit(jobs[3])
        wait_until(lambda: len(scheduler.running()) == 3, timeout=60)
        assert scheduler.running() == [0, 1, 2]
    finally:
        for job in jobs:
            job.cancel()
        model.close()
