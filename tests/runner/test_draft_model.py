"""A draft model drafts where prompt lookup proposes nothing, and the output stays exactly as without it.

The main model and its draft are generated with the same vocabulary and seed; the draft has one block
where the main model has two, so it shares the main model's embeddings, output and first block and
guesses some of its tokens right and others wrong — both kinds of verification run through real
llama.cpp batches. A draft of another vocabulary is refused, and the main model serves without it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_speculative import PROMPTS, Recorder, run

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.load_plan import LoadPlan, plan_load, with_draft
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner.draft_model import FIRST_REST, JUDGE_TOKENS, JUDGE_TRIES, DraftModel, DraftRefused, Payoff
from lmsp_tray.runner.model import LlamaModel, LoadOptions
from lmsp_tray.runner.runtime import Runtime

OPTIONS = LoadOptions(parallel=4, threads=1, speculative=True)


def _entry(path: Path, model_id: str, blocks: int) -> ModelEntry:
    info = GGUFInfo(architecture="llama", context_length=512, block_count=blocks, head_count=4, head_count_kv=4)
    info = GGUFInfo(**{**info.__dict__, "embedding_length": 64})
    return ModelEntry(model_id, path, "custom", path.stat().st_size, (path,), info)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelEntry, ModelEntry]:
    from gguf_factory import write_tiny_gguf

    folder = tmp_path_factory.mktemp("draft")
    main = write_tiny_gguf(folder / "main.gguf", blocks=2, seed=0)
    draft = write_tiny_gguf(folder / "draft.gguf", blocks=1, seed=0, name="Tiny Draft", basename="tiny-draft")
    return _entry(main, "main", 2), _entry(draft, "draft", 1)


def _plan(main: ModelEntry, draft: ModelEntry | None) -> LoadPlan:
    plan = plan_load(main, OPTIONS, gpu_free_bytes=None, cores=1)
    return with_draft(plan, draft) if draft is not None else plan


@pytest.fixture(scope="module")
def plain(pair: tuple[ModelEntry, ModelEntry]) -> Iterator[LlamaModel]:
    main, _ = pair
    loaded = LlamaModel(Runtime(), main, OPTIONS, _plan(main, None))
    yield loaded
    loaded.close()


@pytest.fixture
def drafted(pair: tuple[ModelEntry, ModelEntry]) -> Iterator[LlamaModel]:
    main, draft = pair
    loaded = LlamaModel(Runtime(), main, OPTIONS, _plan(main, draft))
    assert loaded.draft_model is not None, loaded.plan.draft_skipped
    assert loaded.scheduler is not None
    loaded.draft_model.p_min = 0.0  # a random model is seldom sure: guess at every step
    loaded.draft_model.payoff = None  # ... whether it pays or not
    loaded.scheduler.drafter = lambda tokens: Recorder(tokens, {})  # prompt lookup proposes nothing
    yield loaded
    loaded.close()


def guesses_ran(model: LlamaModel) -> None:
    scheduler = model.scheduler
    assert scheduler is not None
    assert scheduler.model_accepted > 0, "no guess of the draft model was ever kept"
    assert scheduler.model_drafted > scheduler.model_accepted, "no guess was ever refused"
    assert scheduler.drafted >= scheduler.model_drafted
    assert model.draft_model is not None and model.draft_model.failed == 0
    stats = model.stats()
    assert (stats.model_drafted, stats.model_accepted) == (scheduler.model_drafted, scheduler.model_accepted)


def test_greedy_output_is_identical_with_a_draft_model(plain: LlamaModel, drafted: LlamaModel) -> None:
    expected = {p: run(plain, p) for p in PROMPTS}
    got = {p: run(drafted, p) for p in PROMPTS}
    assert {p: (t, f.reason, f.output_tokens) for p, (t, f) in got.items()} == {
        p: (t, f.reason, f.output_tokens) for p, (t, f) in expected.items()
    }
    guesses_ran(drafted)


def test_greedy_output_is_identical_with_a_draft_model_batched(plain: LlamaModel, drafted: LlamaModel) -> None:
    expected = {p: run(plain, p, max_tokens=80)[0] for p in PROMPTS}
    for _ in range(2):  # the second round reuses the slots: the draft's sequences follow them
        assert _together(drafted) == expected
    guesses_ran(drafted)
    batches = drafted.stats(batches=True).batch_sizes
    assert max(batches) > len(PROMPTS), "guesses should have shared the others' steps"


def _together(model: LlamaModel) -> dict[str, str]:
    barrier = threading.Barrier(len(PROMPTS))
    results: dict[str, str] = {}

    def one(p: str) -> None:
        barrier.wait()
        results[p] = run(model, p, max_tokens=80)[0]

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_seeded_sampling_is_unchanged_by_a_draft_model(plain: LlamaModel, drafted: LlamaModel) -> None:
    sampling = SamplingParams(temperature=0.7, seed=99)
    expected = {p: run(plain, p, sampling)[0] for p in PROMPTS}
    assert {p: run(drafted, p, sampling)[0] for p in PROMPTS} == expected
    assert drafted.scheduler is not None and drafted.scheduler.model_drafted > 0


def test_a_draft_of_another_vocabulary_is_refused_and_the_model_serves(
    tmp_path: Path, pair: tuple[ModelEntry, ModelEntry], plain: LlamaModel
) -> None:
    from gguf_factory import write_tiny_gguf

    main, _ = pair
    other = write_tiny_gguf(tmp_path / "other.gguf", blocks=1, user_defined=["<extra>"])
    loaded = LlamaModel(Runtime(), main, OPTIONS, _plan(main, _entry(other, "other", 1)))
    try:
        assert loaded.draft_model is None
        reason = loaded.plan.draft_skipped or ""
        assert "'other'" in reason and "vocabulary" in reason and "tokens" in reason
        assert loaded.plan.draft_bytes == 0 and loaded.plan.draft_path is None
        assert run(loaded, PROMPTS[0])[0] == run(plain, PROMPTS[0])[0]
    finally:
        loaded.close()


def test_a_vocabulary_of_the_same_size_with_other_texts_is_refused(tmp_path: Path, plain: LlamaModel) -> None:
    from gguf_factory import write_tiny_gguf

    one = write_tiny_gguf(tmp_path / "one.gguf", blocks=1, user_defined=["<one>"])
    two = write_tiny_gguf(tmp_path / "two.gguf", blocks=1, user_defined=["<two>"])
    loaded = LlamaModel(Runtime(), _entry(one, "one", 1), OPTIONS)
    try:
        with pytest.raises(DraftRefused, match="another vocabulary"):
            DraftModel(
                two,
                loaded.vocab,
                parallel=1,
                context_per_sequence=64,
                batch_size=64,
                threads=1,
                gpu_layers=0,
                use_extra_bufts=False,
            )
    finally:
        loaded.close()


def test_a_draft_that_is_the_model_itself_guesses_right_so_its_kv_follows(
    tmp_path: Path, pair: tuple[ModelEntry, ModelEntry], plain: LlamaModel
) -> None:
    """The same weights as a draft guess what the model decodes only while the draft's KV holds exactly the
    sequence's tokens: after rejected guesses (none here) and after a slot is reused for another prompt."""
    main, _ = pair
    loaded = LlamaModel(Runtime(), main, OPTIONS, _plan(main, main))
    try:
        assert loaded.draft_model is not None and loaded.scheduler is not None
        loaded.draft_model.p_min = 0.0
        loaded.draft_model.payoff = None
        loaded.scheduler.drafter = lambda tokens: Recorder(tokens, {})
        for p in [*PROMPTS, *PROMPTS]:
            assert run(loaded, p)[0] == run(plain, p)[0]
        scheduler = loaded.scheduler
        assert loaded.draft_model.failed == 0
        assert scheduler.model_drafted > 100
        assert scheduler.model_accepted >= 0.95 * scheduler.model_drafted, (
            scheduler.model_accepted,
            scheduler.model_drafted,
        )
    finally:
        loaded.close()


def test_a_draft_model_that_does_not_pay_rests_longer_each_time(pair: tuple[ModelEntry, ModelEntry]) -> None:
    payoff = Payoff()
    payoff.spend(0.05, JUDGE_TOKENS)
    payoff.keep(2, 0.01)  # 20 ms saved for 50 ms spent
    assert [payoff.allowed() for _ in range(FIRST_REST + 1)] == [False] * FIRST_REST + [True]
    payoff.spend(0.05, JUDGE_TOKENS)
    payoff.keep(0, 0.01)
    assert not payoff.allowed() and payoff.rests == [FIRST_REST, 2 * FIRST_REST]
    for _ in range(2 * FIRST_REST - 1):
        payoff.allowed()
    payoff.spend(0.01, JUDGE_TOKENS)
    payoff.keep(30, 0.01)  # it pays again: no rest, and the next one is short again
    assert payoff.allowed() and payoff.rests == [FIRST_REST, 2 * FIRST_REST] and payoff.next_rest == FIRST_REST


def test_a_draft_model_unsure_at_every_step_rests_too() -> None:
    """Consulted, it decodes (the tokens accepted since), yet guesses nothing: that costs too."""
    payoff = Payoff()
    for _ in range(JUDGE_TRIES):
        assert payoff.allowed()
        payoff.spend(0.001, 0)
    assert not payoff.allowed() and payoff.rests == [FIRST_REST]


def test_a_costly_draft_model_is_consulted_less_and_the_output_is_unchanged(
    pair: tuple[ModelEntry, ModelEntry], plain: LlamaModel
) -> None:
    """The one-block draft of a two-block model costs about what the model does, and keeps few guesses:
    judged by what it saves, it rests (the output is the same either way)."""
    main, draft = pair
    loaded = LlamaModel(Runtime(), main, OPTIONS, _plan(main, draft))
    try:
        assert loaded.draft_model is not None and loaded.scheduler is not None
        loaded.draft_model.p_min = 0.0
        loaded.scheduler.drafter = lambda tokens: Recorder(tokens, {})
        for p in PROMPTS:
            assert run(loaded, p, max_tokens=120)[0] == run(plain, p, max_tokens=120)[0]
        payoff = loaded.draft_model.payoff
        assert payoff is not None and payoff.rests, "a draft that saves less than it costs should rest"
    finally:
        loaded.close()
