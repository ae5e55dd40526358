"""The model manager's bookkeeping against fake models: fast, and honest about what it covers.

`ModelManager` takes a model factory; here it makes `FakeModel`s (the way
Ollama's server/sched_test.go fakes its runner), so eviction order, the
memory budget (507 with what is needed), keep-alive, load failures, a model
process dying (`model_crashed`, reloaded on the next request) and shutdown
are checked in milliseconds. The waiting line's 429 is `Admission`, the
counter a model process keeps. What these fakes stand in for is tested for
real elsewhere: test_lifecycle.py (llama.cpp models over HTTP), test_model_crash.py
(real model processes killed) and test_http_responses.py (429 from a real model).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fake_models import Factory
from support import wait_until

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry, Projector
from lmsp_tray.engine.admission import Admission
from lmsp_tray.engine.jobs import GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.engine.manager import ERROR, LOADED, MemoryBudget, ModelManager
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.errors import (
    InsufficientMemory,
    LMSPError,
    ModelCrashed,
    ModelLoadFailed,
    ServiceUnavailable,
    TooManyRequests,
)

MB = 1024 * 1024


def entry(name: str, size_mb: int = 100) -> ModelEntry:
    info = GGUFInfo(
        architecture="llama", context_length=2048, block_count=8, head_count_kv=4, head_count=8, embedding_length=512
    )
    return ModelEntry(name, Path(f"/models/{name}.gguf"), "custom", size_mb * MB, (), info)


@pytest.fixture
def factory() -> Factory:
    return Factory()


def manager(factory: Factory, **kwargs) -> ModelManager:
    kwargs.setdefault("budget", MemoryBudget(max_models=2))
    kwargs.setdefault("reap_interval", 0.01)
    return ModelManager(None, LoadOptions(parallel=2, threads=1), factory=factory, cores=2, **kwargs)


def job() -> GenerationJob:
    return GenerationJob([1, 2, 3], SamplingParams(), 4, lambda item: None)


def test_least_recently_used_idle_model_is_evicted(factory: Factory) -> None:
    m = manager(factory)
    a, b, c = entry("a"), entry("b"), entry("c")
    first = m.acquire(a)
    m.acquire(b)
    m.acquire(a)  # a is now the most recent
    m.acquire(c)
    assert [m.state(x.id)[0] for x in (a, b, c)] == [LOADED, "available", LOADED]
    assert m.get("a") is first  # not reloaded
    assert [f.id for f in factory.made] == ["a", "b", "c"]
    assert factory.made[1].closed == [True]  # evicted with drain
    m.close()


def test_a_busy_model_is_never_evicted_and_a_full_budget_is_507_with_retry_after(factory: Factory) -> None:
    m = manager(factory, budget=MemoryBudget(max_models=1))
    busy = m.acquire(entry("a"))
    busy.submit(job())
    with pytest.raises(InsufficientMemory) as raised:
        m.acquire(entry("b"))
    assert raised.value.status == 507 and "busy" in raised.value.detail
    assert raised.value.headers["Retry-After"] == "5"
    assert m.state("a")[0] == LOADED and m.state("b")[0] == "available"
    busy.finish_all()  # type: ignore[attr-defined]
    m.acquire(entry("b"))  # idle now: it makes room
    assert m.state("a")[0] == "available"
    m.close()


def test_a_model_larger_than_the_budget_is_507_saying_what_it_needs(factory: Factory) -> None:
    m = manager(factory, budget=MemoryBudget(max_models=3, ram_bytes=50 * MB))
    with pytest.raises(InsufficientMemory) as raised:
        m.acquire(entry("big", size_mb=400))
    problem = raised.value.to_problem()
    assert problem["required_bytes"] > problem["available_bytes"] == 50 * MB
    assert "needs about" in problem["detail"] and not factory.made
    m.close()


def test_a_model_whose_projector_does_not_fit_the_budget_loads_text_only(factory: Factory) -> None:
    """Where the text model fits in the budget and its projector does not too, the model is loaded without
    the projector (the plan the factory gets says so) rather than refused with 507."""
    vision = entry("seer", size_mb=100)
    vision.projector = Projector(Path("/models/mmproj-seer.gguf"), 400 * MB, vision=True, audio=False)
    text_only = ModelManager(None, LoadOptions(parallel=2, threads=1), factory=factory, cores=2)
    need = text_only.plan(vision).ram_bytes - text_only.plan(vision).projector_bytes
    text_only.close()
    m = manager(factory, budget=MemoryBudget(max_models=3, ram_bytes=need + 100 * MB))
    model = m.acquire(vision)
    assert model.plan.projector_bytes == 0 and model.plan.ram_bytes == need
    assert model.plan.projector_skipped and "did not fit" in model.plan.projector_skipped
    assert factory.made[-1].plan.projector_skipped == model.plan.projector_skipped  # the model process is told
    m.close()


def test_keep_alive_unloads_idle_models_but_not_busy_ones(factory: Factory) -> None:
    m = manager(factory, keep_alive=0.05)
    idle = m.acquire(entry("idle"))
    busy = m.acquire(entry("busy"))
    busy.submit(job())
    wait_until(lambda: m.state("idle")[0] == "available")
    assert idle.closed == [True]  # type: ignore[attr-defined]
    time.sleep(0.1)
    assert m.state("busy")[0] == LOADED  # generating: kept however long it takes
    busy.finish_all()  # type: ignore[attr-defined]
    wait_until(lambda: m.state("busy")[0] == "available")
    m.close()


def test_per_request_keep_alive_overrides_the_default(factory: Factory) -> None:
    m = manager(factory, keep_alive=None)  # never, unless a request says otherwise
    m.acquire(entry("forever"))
    m.acquire(entry("brief"), keep_alive=0.05)
    wait_until(lambda: m.state("brief")[0] == "available")
    assert m.state("forever")[0] == LOADED
    m.close()


def test_concurrent_acquires_load_once(factory: Factory) -> None:
    m = manager(factory)
    factory.gate = threading.Event()
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(m.acquire(entry("a")))) for _ in range(5)]
    for t in threads:
        t.start()
    wait_until(lambda: m.state("a")[0] == "loading")
    factory.gate.set()
    for t in threads:
        t.join(5)
    assert len(factory.made) == 1 and len(got) == 5 and all(g is factory.made[0] for g in got)
    m.close()


def test_a_failed_load_is_an_error_with_its_reason_and_is_tried_again(factory: Factory) -> None:
    m = manager(factory)
    heard: list[tuple[str, str]] = []
    m.subscribe(lambda model_id, state: heard.append((model_id, state)))
    factory.fail["a"] = ModelLoadFailed("Could not load 'a': bad tensor")
    with pytest.raises(ModelLoadFailed):
        m.acquire(entry("a"))
    state, error = m.state("a")
    assert state == ERROR and error is not None and "bad tensor" in error.detail
    assert heard == [("a", "loading"), ("a", ERROR)]
    del factory.fail["a"]
    m.acquire(entry("a"))
    assert m.state("a") == (LOADED, None)
    m.close()


def test_a_crashed_model_is_an_error_until_the_next_request_loads_it_again(factory: Factory) -> None:
    m = manager(factory)
    heard: list[tuple[str, str]] = []
    m.subscribe(lambda model_id, state: heard.append((model_id, state)))
    first = m.acquire(entry("a"))
    other = m.acquire(entry("b"))
    first.crash()  # type: ignore[attr-defined]
    state, error = m.state("a")
    assert state == ERROR and isinstance(error, ModelCrashed) and "SIGKILL" in error.detail
    assert ("a", ERROR) in heard and m.get("a") is None
    wait_until(lambda: first.closed == [False])  # type: ignore[attr-defined]  # its process is reaped
    assert m.state("b")[0] == LOADED and m.get("b") is other  # the other model is untouched
    again = m.acquire(entry("a"))
    assert again is not first and m.state("a") == (LOADED, None)
    first.crash()  # type: ignore[attr-defined]  # a late report from the old process changes nothing
    assert m.state("a") == (LOADED, None)
    m.close()


def test_close_unloads_everything_and_refuses_new_loads(factory: Factory) -> None:
    m = manager(factory)
    loaded = [m.acquire(entry("a")), m.acquire(entry("b"))]
    m.close()
    assert all(model.closed == [False] for model in loaded)  # type: ignore[attr-defined]
    with pytest.raises(ServiceUnavailable):
        m.acquire(entry("c"))


def test_a_load_that_finishes_after_close_is_closed_at_once(factory: Factory) -> None:
    m = manager(factory)
    factory.gate = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        try:
            m.acquire(entry("late"))
        except LMSPError as exc:
            errors.append(exc)

    t = threading.Thread(target=load)
    t.start()
    wait_until(lambda: m.state("late")[0] == "loading")
    closer = threading.Thread(target=m.close)
    closer.start()
    factory.gate.set()
    t.join(5)
    closer.join(5)
    assert isinstance(errors[0], ServiceUnavailable)
    assert factory.made[0].closed == [False]


def test_the_waiting_line_is_429_with_retry_after_then_503_when_closing() -> None:
    line = Admission(parallel=2, max_queue=3)
    for _ in range(5):
        line.admit()
    with pytest.raises(TooManyRequests) as raised:
        line.admit()
    assert raised.value.status == 429 and raised.value.headers["Retry-After"] == "4"  # 2 s each, 2 at a time
    for _ in range(3):
        line.done(10.0)
    for _ in range(3):
        line.admit()  # room again
    with pytest.raises(TooManyRequests) as raised:
        line.admit()
    assert raised.value.headers["Retry-After"] == "20"  # from what requests took: 10 s, 4 waves of 2
    line.close()
    with pytest.raises(ServiceUnavailable):
        line.admit()


def test_load_progress_is_seen_while_loading_and_gone_after() -> None:
    """What the factory reports while it loads is `load_progress` (the console's bar); None once loaded."""
    halfway, release = threading.Event(), threading.Event()
    inner = Factory()

    def factory(entry, options, plan, on_exit, on_progress=None):
        assert on_progress is not None
        on_progress(0.25)
        on_progress(0.5)
        halfway.set()
        assert release.wait(10)
        return inner(entry, options, plan, on_exit)

    models = ModelManager(None, LoadOptions(threads=1), factory=factory, reap_interval=3600, cores=2)
    e = entry("a")
    loader = threading.Thread(target=models.acquire, args=(e,))
    loader.start()
    assert halfway.wait(10)
    assert models.state("a")[0] == "loading" and models.load_progress("a") == 0.5
    release.set()
    loader.join(10)
    assert models.state("a")[0] == "loaded" and models.load_progress("a") is None
    models.close()
