"""Speculative decoding is exact: what the engine emits with drafts equals what it emits without.

Random generated models seldom repeat themselves, so prompt lookup would rarely propose anything
here. These tests give the scheduler drafts that are right, partly right and wrong in turn (an
oracle that knows the output made without speculation, and spoils some of its proposals), so every
path — a draft kept whole, kept in part, refused at once — runs through real llama.cpp batches.
Prompt lookup itself is tested as logic below, and on Gemma by `benchmarks/edit_workload.py`.
"""

from __future__ import annotations

import collections
import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.jobs import CANCELLED, LENGTH, Finish, GenerationJob, TokenLogprob
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner.batch import Batch
from lmsp_tray.runner.model import LlamaModel, LoadOptions
from lmsp_tray.runner.runtime import Runtime
from lmsp_tray.runner.speculation import (
    FIRST_PAUSE,
    LONG_DRAFT,
    LONGER_DRAFT,
    MAX_DRAFT,
    MISSES_BEFORE_PAUSE,
    REACH,
    RECALLED_DRAFT,
    RECENT_SEQUENCES,
    Drafting,
    PromptLookup,
    Recent,
    reach,
)

PROMPTS = ["hello world", "the local model", "a test of the stream", "weather in the city"]
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def entry(tmp_path_factory: pytest.TempPathFactory) -> ModelEntry:
    from gguf_factory import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("spec") / "tiny.gguf")
    info = GGUFInfo(architecture="llama", context_length=512, block_count=2)
    return ModelEntry("tiny", Path(path), "custom", path.stat().st_size, (path,), info)


@pytest.fixture(scope="module")
def plain(entry: ModelEntry) -> Iterator[LlamaModel]:
    loaded = LlamaModel(Runtime(), entry, LoadOptions(parallel=4, threads=1, speculative=False))
    yield loaded
    loaded.close()


@pytest.fixture
def spec(entry: ModelEntry) -> Iterator[LlamaModel]:
    loaded = LlamaModel(Runtime(), entry, LoadOptions(parallel=4, threads=1, speculative=True))
    yield loaded
    loaded.close()


class Recorder:
    """A drafter that proposes nothing and writes down every token of the sequence."""

    def __init__(self, tokens: list[int], into: dict[tuple[int, ...], list[int]]) -> None:
        self.tokens = list(tokens)
        into[tuple(tokens[:-1])] = self.tokens  # keyed by the prompt

    def append(self, token: int) -> None:
        self.tokens.append(token)

    def draft(self, limit: int, long_limit: int = 0, *, loop: bool = False) -> list[int]:
        return []


class Oracle:
    """Proposes what the sequence is known to become, spoiling every second and third draft: one at
    its middle token (kept in part), one at its first (refused at once)."""

    def __init__(self, tokens: list[int], known: dict[tuple[int, ...], list[int]], n_vocab: int) -> None:
        self.tokens = list(tokens)
        self.future = known[tuple(tokens[:-1])]
        self.n_vocab = n_vocab
        self.calls = 0

    def append(self, token: int) -> None:
        self.tokens.append(token)

    def draft(self, limit: int, long_limit: int = 0, *, loop: bool = False) -> list[int]:
        at = len(self.tokens)
        draft = list(self.future[at : at + limit])
        self.calls += 1
        if draft and self.calls % 3:
            spoil = len(draft) // 2 if self.calls % 3 == 1 else 0
            draft[spoil] = (draft[spoil] + 1) % self.n_vocab
        return draft


def submit(model: LlamaModel, prompt: str, sampling: SamplingParams, max_tokens: int, **job: object) -> queue.Queue:
    out: queue.Queue = queue.Queue()
    model.submit(
        GenerationJob(prompt=model.tokenize(prompt), sampling=sampling, max_tokens=max_tokens, sink=out.put, **job)
    )
    return out


def collect(out: queue.Queue, on_text: threading.Event | None = None) -> tuple[str, Finish]:
    text = []
    while True:
        item = out.get(timeout=60)
        if isinstance(item, Finish):
            return "".join(text), item
        if isinstance(item, str):
            text.append(item)
            if on_text is not None:
                on_text.set()


def run(model: LlamaModel, prompt: str, sampling: SamplingParams = GREEDY, max_tokens: int = 60, **job: object):
    return collect(submit(model, prompt, sampling, max_tokens, **job))


def record(model: LlamaModel, prompts: list[str], sampling: SamplingParams, max_tokens: int, **job: object):
    """Every prompt's tokens and output as the speculative model makes them without drafts."""
    known: dict[tuple[int, ...], list[int]] = {}
    model.scheduler.drafter = lambda tokens: Recorder(tokens, known)
    outputs = {p: run(model, p, sampling, max_tokens, **job) for p in prompts}
    model.scheduler.drafter = lambda tokens: Oracle(tokens, known, model.n_vocab)
    return outputs


def drafts_ran(model: LlamaModel) -> None:
    scheduler = model.scheduler
    assert scheduler is not None
    assert scheduler.accepted > 0, "no draft token was ever kept"
    assert scheduler.drafted > scheduler.accepted, "no draft token was ever refused"


def test_greedy_output_is_identical_with_drafts_kept_and_refused(plain: LlamaModel, spec: LlamaModel) -> None:
    expected = {p: run(plain, p) for p in PROMPTS}
    assert record(spec, PROMPTS, GREEDY, 60) == expected
    steps = spec.scheduler.steps
    for p in PROMPTS:
        text, finish = run(spec, p)
        assert (text, finish.reason, finish.output_tokens) == (expected[p][0], LENGTH, 60)
    drafts_ran(spec)
    assert spec.scheduler.steps - steps < steps, "drafts kept should save decode steps"


def test_a_request_asked_again_drafts_its_earlier_answer_exactly(plain: LlamaModel, spec: LlamaModel) -> None:
    """The second asking drafts the first answer (`Recent`): long drafts kept whole, fewer steps, and the
    same greedy text as without speculation, alone and with a seeded sampler."""
    expected = run(plain, PROMPTS[1], max_tokens=80)[0]
    scheduler = spec.scheduler
    assert scheduler is not None
    assert run(spec, PROMPTS[1], max_tokens=80)[0] == expected
    steps, accepted = scheduler.steps, scheduler.accepted
    assert run(spec, PROMPTS[1], max_tokens=80)[0] == expected
    assert scheduler.accepted - accepted >= 60, "the earlier answer should have drafted the new one"
    assert scheduler.steps - steps <= 10, scheduler.steps - steps
    sampling = SamplingParams(temperature=1.0, seed=99)
    seeded = run(plain, PROMPTS[2], sampling, 80)[0]
    assert run(spec, PROMPTS[2], sampling, 80)[0] == seeded
    assert run(spec, PROMPTS[2], sampling, 80)[0] == seeded


def test_verified_draft_tokens_carry_their_log_probabilities(plain: LlamaModel, spec: LlamaModel) -> None:
    """A job asking for log probabilities gets one per token, the same as without drafts, for the tokens a
    kept draft verified too (they went out without one before)."""

    def steps(model: LlamaModel) -> list[tuple[bytes, float]]:
        out = submit(model, PROMPTS[0], GREEDY, 40, logprobs=2)
        items = []
        while not isinstance(item := out.get(timeout=60), Finish):
            items.append(item)
        return [(i.piece, i.logprob) for i in items if isinstance(i, TokenLogprob)]

    expected = steps(plain)
    record(spec, PROMPTS[:1], GREEDY, 40, logprobs=2)
    accepted = spec.scheduler.accepted
    got = steps(spec)
    assert len(got) == len(expected) == 40, (len(got), len(expected))
    assert [piece for piece, _ in got] == [piece for piece, _ in expected]
    # the same values up to the rounding of a batch of another size (a verified position is one of several)
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in expected], abs=0.02)
    assert spec.scheduler.accepted > accepted, "no draft was kept: the test did not test verified tokens"


def test_greedy_output_is_identical_batched_with_three_others(
    plain: LlamaModel, spec: LlamaModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four sequences drafting together (the oracle's drafts grow and shrink with each one's luck) give
    what each gives without drafts, and every shared step feeds one draft length (`even_drafts`): each
    decoding sequence one token, or that token and a draft of the step's one length."""
    expected = {p: run(plain, p)[0] for p in PROMPTS}
    record(spec, PROMPTS, GREEDY, 60)
    shapes: list[list[int]] = []
    real = Batch.decode

    def decode(self: Batch, ctx: object, n: int) -> int:
        fed, with_logits = collections.Counter[int](), collections.Counter[int]()
        for i in range(n):
            seq = self.raw.seq_id[i][0]
            fed[seq] += 1
            with_logits[seq] += bool(self.raw.logits[i])
        shapes.append(sorted(count for seq, count in fed.items() if with_logits[seq] == count))  # decoding ones
        return real(self, ctx, n)

    monkeypatch.setattr(Batch, "decode", decode)
    barrier = threading.Barrier(len(PROMPTS))
    results: dict[str, str] = {}

    def together(p: str) -> None:
        barrier.wait()
        results[p] = run(spec, p)[0]

    threads = [threading.Thread(target=together, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
    drafts_ran(spec)
    assert max(spec.stats(batches=True).batch_sizes) > len(PROMPTS), "drafts should have shared the others' steps"
    shared = [shape for shape in shapes if len(shape) > 1 and max(shape) > 1]
    assert shared, "no step had drafts beside other sequences"
    assert all(len(set(shape) - {1}) == 1 for shape in shared), f"a shared step fed drafts of several lengths: {shared}"


def test_seeded_sampling_is_unchanged_by_drafts(plain: LlamaModel, spec: LlamaModel) -> None:
    sampling = SamplingParams(temperature=1.0, seed=1234)
    expected = {p: run(plain, p, sampling)[0] for p in PROMPTS}
    record(spec, PROMPTS, sampling, 60)
    assert {p: run(spec, p, sampling)[0] for p in PROMPTS} == expected
    drafts_ran(spec)


def test_grammar_constrained_output_stays_valid_and_identical(plain: LlamaModel, spec: LlamaModel) -> None:
    grammar = r"""root ::= "[" item ("," item)* "]"
item ::= "{\"a\":" num "}"
num ::= [1-9] [0-9]? | "0"
"""
    sampling = SamplingParams(temperature=0.0, grammar=grammar)
    expected = {p: run(plain, p, sampling, 48) for p in PROMPTS}
    record(spec, PROMPTS, sampling, 48)
    for p in PROMPTS:
        text, finish = run(spec, p, sampling, 48)
        assert text == expected[p][0]
        assert finish.reason != LENGTH, "the grammar's document should close within the limit"
        items = json.loads(text)
        assert all(set(item) == {"a"} and isinstance(item["a"], int) for item in items)
    drafts_ran(spec)


def test_cancelling_a_speculative_sequence_leaves_the_others_unchanged(plain: LlamaModel, spec: LlamaModel) -> None:
    others = PROMPTS[1:]
    expected = {p: run(plain, p, max_tokens=200)[0] for p in others}
    record(spec, PROMPTS, GREEDY, 200)
    doomed_out: queue.Queue = queue.Queue()
    doomed = GenerationJob(prompt=spec.tokenize(PROMPTS[0]), sampling=GREEDY, max_tokens=200, sink=doomed_out.put)
    spec.submit(doomed)
    outs = {p: submit(spec, p, GREEDY, 200) for p in others}
    first = threading.Event()
    result: list[Finish] = []
    waiter = threading.Thread(target=lambda: result.append(collect(doomed_out, first)[1]))
    waiter.start()
    assert first.wait(30)
    doomed.cancel()
    waiter.join(30)
    assert {p: collect(out)[0] for p, out in outs.items()} == expected
    assert result[0].reason == CANCELLED and result[0].output_tokens < 200
    drafts_ran(spec)


def test_prompt_lookup_proposes_what_followed_the_latest_earlier_occurrence() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 1, 2, 3])
    assert lookup.draft(3) == [4, 5, 9]  # (1, 2, 3) began the sequence
    lookup.append(4)
    assert lookup.draft(2) == [5, 9]  # the 4-gram (1, 2, 3, 4) wins over the later 3-gram (2, 3, 4)
    lookup.append(6)
    assert lookup.draft(4) == []  # (3, 4, 6) never seen before
    assert PromptLookup([5]).draft(4) == []
    assert PromptLookup([]).draft(4) == []
    assert PromptLookup([1, 2, 3, 1, 2, 3]).draft(0) == []
    assert PromptLookup([1, 2, 3, 1, 2, 3]).draft(5) == [1, 2, 3]
    assert PromptLookup([5, 1, 2, 9, 1, 2]).draft(5) == []  # 2-grams recur by chance: not enough


def test_prompt_lookup_prefers_the_longer_match() -> None:
    # (7, 8, 2, 3) occurred once, followed by 50; (8, 2, 3) occurred later, followed by 60.
    lookup = PromptLookup([7, 8, 2, 3, 50, 0, 8, 2, 3, 60, 7, 8, 2, 3])
    assert lookup.draft(1) == [50]


def test_a_sequence_repeating_itself_drafts_around_its_loop() -> None:
    """What followed the ending's latest occurrence runs into the present: with `loop` (a sequence decoding
    alone), the draft goes on with itself; without, it stops at the present."""
    lookup = PromptLookup([9, 8, 4, 5, 6, 4, 5, 6, 4, 5])
    assert lookup.draft(8, loop=True) == [6, 4, 5, 6, 4, 5, 6, 4]  # (6, 4, 5) two tokens back: a loop of three
    assert lookup.draft(8) == [6, 4, 5]
    lookup.append(6)
    assert lookup.draft(3, loop=True) == [4, 5, 6]
    assert PromptLookup([1, 2, 3, 1, 2, 3, 7]).draft(4, loop=True) == []  # the loop was left: nothing to go around
    assert PromptLookup([3, 3, 3, 3]).draft(5, loop=True) == [3, 3, 3, 3, 3]
    assert PromptLookup([1, 2, 3, 1, 2, 3]).draft(5, loop=True) == [1, 2, 3, 1, 2]


def test_a_copied_passage_drafts_long_at_once() -> None:
    passage = list(range(100, 180))  # 80 tokens, then its first 12 again: a passage being copied
    lookup = PromptLookup([*passage, 1, 2, *passage[:12]])
    assert MAX_DRAFT < LONG_DRAFT < LONGER_DRAFT < 63  # under 64 queries with the next token (see the module)
    assert lookup.draft(2, 100) == passage[12 : 12 + LONG_DRAFT]  # a 12-token match: the long length
    assert lookup.draft(2, 10) == passage[12:22]  # within the room given
    assert lookup.draft(2) == passage[12:14]  # no long limit given: the adaptive limit
    short = PromptLookup([*passage, 1, 2, *passage[8:12]])
    assert short.draft(2, 100) == passage[12:14]  # a 4-token match stays short


def test_a_24_token_match_picks_its_passage_and_drafts_longer() -> None:
    """As llama.cpp's ngram-mod: 24 matched tokens choose among the places the last 12 occur, and draft
    longer than after 12."""
    passage = list(range(100, 200))  # 100 tokens; later its tokens 12..23 recur, followed by others
    lookup = PromptLookup([*passage, 1, *passage[12:24], 7, 8, 9, 2, *passage[:24]])
    assert lookup.draft(2, 100) == passage[24 : 24 + LONGER_DRAFT]  # not [7, 8, 9, ...] after the later 12
    assert lookup.draft(2, 20) == passage[24:44]  # within the room given
    twelve = PromptLookup([*passage, 1, *passage[12:24], 7, 8, 9, 2, 5, *passage[12:24]])
    loop = [7, 8, 9, 2, 5, *passage[12:24]]  # 12 matched: the latest place (around the loop it closes)
    assert twelve.draft(2, 100) == loop
    assert twelve.draft(2, 100, loop=True) == (loop * 3)[:LONG_DRAFT]


def answered(recent: Recent, sequence: list[int], cut: int) -> None:
    """`sequence` decoded as the scheduler does it (indexed from its prompt and first token on), then
    finished into `recent`."""
    lookup = PromptLookup(sequence[: cut + 1], recent)
    for token in sequence[cut + 1 :]:
        lookup.append(token)
    recent.add(lookup)


def test_a_request_asked_again_drafts_from_the_earlier_answer() -> None:
    prompt, answer = list(range(100, 140)), list(range(500, 560))
    recent = Recent()
    answered(recent, [*prompt, *answer], len(prompt))
    again = PromptLookup([*prompt, answer[0]], recent)
    assert again.draft(2, 100) == answer[1 : 1 + LONGER_DRAFT]  # from its first token: a 24-token match
    assert again.draft(0, 10) == answer[1:11]  # within the room given, while short drafts are paused
    assert again.draft(2) == answer[1:3]
    assert PromptLookup([*prompt, answer[0]]).draft(2, 100) == []  # without `recent`: nothing to copy
    short = PromptLookup([7, *prompt[-8:], answer[0]], recent)
    assert short.draft(2, 100) == []  # only long matches are looked up in other sequences
    # Agreeing over `RECALL` tokens or more (a long prompt asked again, or well into its answer): longer.
    prompt, answer = list(range(1000, 1100)), list(range(2000, 2100))
    answered(recent, [*prompt, *answer], len(prompt))
    again = PromptLookup([*prompt, answer[0]], recent)
    assert LONGER_DRAFT < RECALLED_DRAFT < 63
    assert again.draft(2, 100) == answer[1 : 1 + RECALLED_DRAFT]
    assert again.draft(2, 40) == answer[1:41]


def test_an_earlier_answer_that_repeats_itself_drafts_from_where_the_present_stands() -> None:
    """A small model's answer often repeats itself (Gemma 3 270M goes on after an edited text, copying
    it again). Asked again, the present's 24 tokens also occur in the repetition, later, where the index
    points; there the answer agrees with the present over a few tokens only and ends soon. The place
    where the present stands in the earlier answer (the same prompt: the same position) agrees over the
    whole prompt and drafts on, long."""
    prompt, part = list(range(100, 140)), list(range(500, 580))
    answer = [*part, *part, 7, 8]
    recent = Recent()
    answered(recent, [*prompt, *answer], len(prompt))
    present = [*prompt, *part[:30]]
    assert recent.find(present, tuple(part[6:30])) == ([*prompt, *answer], len(present), 46)
    assert PromptLookup(present, recent).draft(2, 100) == answer[30 : 30 + RECALLED_DRAFT]
    # A present at another position (a longer prompt) still finds the latest occurrence.
    shifted = [1, *present]
    assert recent.find(shifted, tuple(part[6:30])) == ([*prompt, *answer], len(prompt) + 110, 6)


def test_the_match_that_agrees_further_back_wins() -> None:
    """Asked again to edit a text: the prompt's copy of the text drafts the unedited token, the earlier
    answer the edit; the earlier answer agrees with the present further back, so it drafts."""
    text, instruction, turn = list(range(200, 260)), [1, 2, 3], [7, 8]
    edited = [*text[:30], 999, *text[31:]]
    asked = [*instruction, *text, *turn]
    recent = Recent()
    answered(recent, [*asked, *edited], len(asked))
    lookup = PromptLookup([*asked, *edited[:30]], recent)
    assert lookup.draft(2, 100) == edited[30 : 30 + LONGER_DRAFT]  # [999, ...]: the edit
    assert PromptLookup([*asked, *edited[:30]]).draft(2, 100) == [*text[30:], *turn]  # alone: the text
    # The sequence's own match wins where it agrees as far back (a tie): it is the present conversation.
    alone = PromptLookup([*text, 5, *text[:30]], recent)
    assert alone.draft(2, 100) == [*text[30:], 5, text[0]]
    assert reach(text, 30, text[:40], 10) == 30  # the agreement stops where a sequence starts
    assert reach(text, 30, [5, *text[:40]], 10) == 30
    assert reach([5, *text], 31, text[:40], 10) == 30
    assert reach([6, *text], 31, [5, *text[:40]], 10) == 30  # and where the two differ
    long = list(range(5000))
    assert reach(long, 2000, long[:2100], 100) == REACH  # and at `REACH`


def test_recent_keeps_the_newest_sequences_within_its_budget() -> None:
    recent = Recent(budget=100)
    first, second, third = (list(range(k, k + 40)) for k in (1000, 2000, 3000))
    for sequence in (first, second, third):  # 120 tokens: the oldest is dropped
        answered(recent, sequence, 12)
    assert recent.find(first[:12], tuple(first[:12])) is None
    assert recent.find(third[:12], tuple(third[:12])) == (third, 12, 0)
    assert recent.find(second[:28], tuple(second[4:28])) == (second, 28, 4)
    answered(recent, list(range(9000, 9101)), 0)  # longer than the whole budget: not kept
    assert recent.find(list(range(9000, 9012)), tuple(range(9000, 9012))) is None
    assert recent.find(third[:12], tuple(third[:12])) == (third, 12, 0)
    many = Recent()
    for k in range(RECENT_SEQUENCES + 1):  # short ones: the count bounds the lookups a step makes
        answered(many, [k, *range(100, 120)], 12)
    assert many.find([0, *range(100, 111)], (0, *range(100, 111))) is None
    assert many.find([1, *range(100, 111)], (1, *range(100, 111))) == ([1, *range(100, 120)], 12, 0)


def test_of_recent_sequences_the_one_agreeing_further_back_drafts() -> None:
    """Two documents of one form (other names) share their endings: asked the first again, the newest
    answer (the second document's) would draft its own names; the first's answer agrees further back."""
    form = list(range(300, 340))
    first = [1, 2, 3, 4, 5, 6, 7, 8, *form, 500, 501, 502]  # a form, then its answer
    second = [9, 9, 9, 9, 9, 9, 9, 9, *form, 600, 601, 602]
    recent = Recent()
    answered(recent, first, len(first) - 4)
    answered(recent, second, len(second) - 4)  # the newest
    assert recent.find(first[:-3], tuple(first[-27:-3])) == (first, len(first) - 3, 24)  # the second agrees over 16
    assert recent.find([7, *form], tuple(form[-24:])) == (second, len(second) - 3, 16)  # equals: the newest
    assert PromptLookup(first[:-3], recent).draft(2, 100) == [500, 501, 502]


def test_a_long_match_drafts_while_short_drafts_are_paused() -> None:
    passage = list(range(100, 180))
    lookup = PromptLookup([*passage, 1, 2, *passage[:12]])
    # limit 0: short drafts paused, a copied passage is not
    assert lookup.draft(0, 100) == passage[12 : 12 + LONG_DRAFT]
    short = PromptLookup([*passage, 1, 2, *passage[8:12]])
    assert short.draft(0, 100) == []
    drafting = Drafting()
    for _ in range(MISSES_BEFORE_PAUSE):
        drafting.record(drafting.limit(), 0)
    assert drafting.limit() == 0
    drafting.record(LONG_DRAFT, LONG_DRAFT)  # that long draft was taken whole: the pause ends
    assert drafting.limit() > 0


def test_drafting_grows_on_success_and_pauses_after_misses() -> None:
    drafting = Drafting()
    first = drafting.limit()
    drafting.record(first, first)
    assert drafting.limit() == 2 * first
    for _ in range(5):
        drafting.record(drafting.length, drafting.length)
    assert drafting.limit() == MAX_DRAFT
    drafting.record(MAX_DRAFT, 3)
    assert drafting.limit() == 4
    for _ in range(MISSES_BEFORE_PAUSE):
        drafting.record(drafting.limit(), 0)
    assert [drafting.limit() for _ in range(FIRST_PAUSE)] == [0] * FIRST_PAUSE
    assert drafting.limit() > 0
    for _ in range(MISSES_BEFORE_PAUSE):  # failing again pauses longer
        drafting.record(drafting.limit(), 0)
    assert [drafting.limit() for _ in range(2 * FIRST_PAUSE)] == [0] * (2 * FIRST_PAUSE)
    assert drafting.limit() > 0
