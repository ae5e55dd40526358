"""The prompt cache on disk: states saved at unload come back after a real restart, bad files never load.

Real llama.cpp on generated GGUFs: a model process (a real child process) saves
its sequence's state when it closes, and a new one restores it — the continued
turn equals the same conversation continued in memory, and the restored tokens
count as cached. A file saved with other settings, a truncated one, one with a
flipped byte and one from another model are each refused and removed (and the
request is answered as without a cache). The disk budget evicts the least
recently used file.
"""

from __future__ import annotations

import os
import queue
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from generation import entry_for, generate
from gguf_factory import write_tiny_gguf
from support import wait_until

from lmsp_tray.engine.cache_folders import SUFFIX, model_folder
from lmsp_tray.engine.jobs import LENGTH, Finish, GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions, plan_load
from lmsp_tray.engine.process import ModelProcess
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner.model import LlamaModel
from lmsp_tray.runner.prompt_cache import PromptCache, WindowCheckpoint
from lmsp_tray.runner.runtime import Runtime

WORDS = ["hello", "world", "the", "local", "model", "a", "test", "of", "the", "stream", "weather", "in", "the", "city"]


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("pc-other") / "other.gguf", seed=7)


def options(cache: Path | None, **more: object) -> LoadOptions:
    return LoadOptions(
        threads=1,
        parallel=1,
        speculative=False,
        prompt_cache_dir=str(cache) if cache else None,
        prompt_cache_bytes=1 << 30 if cache else 0,
        **more,
    )


def history(model: LlamaModel | ModelProcess) -> list[int]:
    """About 320 tokens: more than the cache's minimum, leaving room in the 512-token window."""
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(400))
    return model.tokenize_prompt(text)[:320]


def saved_files(cache: Path) -> list[Path]:
    return sorted(cache.rglob(f"*{SUFFIX}"))


@pytest.fixture
def load(tmp_path: Path) -> Iterator:
    loaded: list[LlamaModel] = []

    def make(path: Path, opts: LoadOptions) -> LlamaModel:
        model = LlamaModel(Runtime(), entry_for(path), opts)
        loaded.append(model)
        return model

    yield make
    for model in loaded:
        model.close()


def test_a_state_saved_at_unload_is_restored_after_a_process_restart(tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "prompt-cache"
    entry = entry_for(tiny_gguf)

    def start(opts: LoadOptions) -> ModelProcess:
        return ModelProcess(entry, opts, plan_load(entry, opts, gpu_free_bytes=None, cores=1))

    first = start(options(cache))
    try:
        earlier = history(first)
        assert len(earlier) == 320
        question = first.tokenize_prompt(" the city weather", at_most=None)[1:]
        generate(first, earlier)
    finally:
        first.close()  # the unload writes the sequence's state
    assert len(saved_files(cache)) == 1

    # The same conversation continued in memory, with no cache at all.
    plain = start(options(None))
    try:
        generate(plain, earlier)
        in_memory, reused = generate(plain, earlier + question)
    finally:
        plain.close()
    assert reused.cached_tokens >= len(earlier)

    second = start(options(cache))  # a new process: nothing in memory, the file on disk
    try:
        assert second.pid != first.pid
        restored, finish = generate(second, earlier + question)
    finally:
        second.close()
    assert restored == in_memory
    assert (finish.reason, finish.cached_tokens) == (LENGTH, reused.cached_tokens)


def test_a_model_process_whose_service_vanished_saves_before_it_exits(tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "prompt-cache"
    entry = entry_for(tiny_gguf)
    opts = options(cache)
    model = ModelProcess(entry, opts, plan_load(entry, opts, gpu_free_bytes=None, cores=1))
    try:
        generate(model, history(model))
        assert model._proc.stdin is not None
        model._proc.stdin.close()  # as when the service is killed: its end of the pipe closes
        assert model._proc.wait(60) == 0
    finally:
        model.kill()
        model.close()
    assert len(saved_files(cache)) == 1


def save_one(load, path: Path, cache: Path, **more: object) -> tuple[list[int], str]:
    model = load(path, options(cache, **more))
    prompt = history(model)
    generate(model, prompt)
    model.close()
    files = saved_files(cache)
    assert len(files) == 1
    return prompt, files[0].name


def continue_fresh(load, path: Path, cache: Path, prompt: list[int], **more: object) -> Finish:
    model = load(path, options(cache, **more))
    text, finish = generate(model, prompt + prompt[1:40])
    fresh = load(path, options(None, **more))
    assert generate(fresh, prompt + prompt[1:40]).text == text  # a refused file changes nothing but the time
    return finish


def test_the_cache_restores_in_process_and_counts_restored_tokens(load, tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "pc"
    prompt, _ = save_one(load, tiny_gguf, cache)
    finish = continue_fresh(load, tiny_gguf, cache, prompt)
    assert finish.cached_tokens >= len(prompt)


def test_a_state_saved_with_other_settings_is_refused_and_removed(
    load, tmp_path_factory: pytest.TempPathFactory, caplog
) -> None:
    roomy = write_tiny_gguf(tmp_path_factory.mktemp("roomy") / "roomy.gguf", context_length=2048)
    cache = tmp_path_factory.mktemp("pc")
    prompt, _ = save_one(load, roomy, cache, context_cap=2048)
    finish = continue_fresh(load, roomy, cache, prompt, context_cap=1024)  # a smaller KV cache per sequence
    assert finish.cached_tokens == 0
    assert saved_files(cache) == []
    assert "saved for another model file or other settings" in caplog.text


def test_a_truncated_file_is_refused_and_removed(load, tiny_gguf: Path, tmp_path: Path, caplog) -> None:
    cache = tmp_path / "pc"
    prompt, _ = save_one(load, tiny_gguf, cache)
    path = saved_files(cache)[0]
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size - 1000)
    finish = continue_fresh(load, tiny_gguf, cache, prompt)
    assert finish.cached_tokens == 0
    assert not path.exists()
    assert "truncated or padded" in caplog.text


def test_a_flipped_byte_is_refused_and_removed(load, tiny_gguf: Path, tmp_path: Path, caplog) -> None:
    cache = tmp_path / "pc"
    prompt, _ = save_one(load, tiny_gguf, cache)
    path = saved_files(cache)[0]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the KV state, past the header and the tokens
    path.write_bytes(bytes(data))
    finish = continue_fresh(load, tiny_gguf, cache, prompt)
    assert finish.cached_tokens == 0
    assert not path.exists()
    assert "checksum mismatch" in caplog.text


def test_a_file_from_another_model_is_refused_and_removed(
    load, tiny_gguf: Path, other: Path, tmp_path: Path, caplog
) -> None:
    cache = tmp_path / "pc"
    prompt, _ = save_one(load, other, cache)
    foreign = saved_files(cache)[0]
    ours = model_folder(cache, tiny_gguf)
    ours.mkdir(parents=True)
    shutil.copy(foreign, ours / foreign.name)
    finish = continue_fresh(load, tiny_gguf, cache, prompt)
    assert finish.cached_tokens == 0
    assert not (ours / foreign.name).exists()
    assert foreign.exists()  # the other model's own file is its own business
    assert "saved for another model file or other settings" in caplog.text


def test_the_disk_budget_evicts_the_least_recently_used(tmp_path: Path, tiny_gguf: Path) -> None:
    key = b"k" * 32
    state = os.urandom(100_000)
    size = 100_000 + 4 * 300 + 64
    cache = PromptCache(tmp_path, tiny_gguf, key, budget_bytes=int(size * 2.5))
    a, b, c = ([i] * 300 for i in (1, 2, 3))
    cache.save(a, state)
    cache.save(b, state)
    cache.close()
    (saved_a, _), (saved_b, _) = cache.best(a + [9]), cache.best(b + [9])
    assert saved_a is not None and saved_b is not None
    os.utime(saved_a.path, (1, 1))
    os.utime(saved_b.path, (2, 2))
    assert cache.load(saved_a) is not None  # a restore makes `a` the most recently used
    cache.save(c, state)
    cache.close()
    assert saved_a.path.exists() and not saved_b.path.exists()
    assert [len(s.tokens) for s in cache.entries] == [300, 300]
    assert PromptCache(tmp_path, tiny_gguf, key, budget_bytes=1 << 20).best(b)[1] == 0  # gone from disk too


def test_window_checkpoints_are_saved_with_a_state_and_come_back_with_it(tmp_path: Path, tiny_gguf: Path) -> None:
    key = b"k" * 32
    state, first, second = os.urandom(50_000), os.urandom(7_000), os.urandom(9_000)
    cache = PromptCache(tmp_path, tiny_gguf, key, budget_bytes=1 << 30)
    checkpoints = [WindowCheckpoint(0, 259, first), WindowCheckpoint(40, 299, memoryview(second))]
    cache.save([3] * 310, state, checkpoints)
    cache.close()
    again = PromptCache(tmp_path, tiny_gguf, key, budget_bytes=1 << 30)  # indexed from the file alone
    [saved] = again.entries
    assert saved.tokens == (3,) * 310 and saved.checkpoints == (259, 299)
    loaded = again.load(saved, windows=2)
    assert loaded is not None and bytes(loaded.state) == state
    assert [(c.pos_min, c.pos_max, bytes(c.data)) for c in loaded.checkpoints] == [(0, 259, first), (40, 299, second)]
    newest = again.load(saved, windows=1)  # the next turn goes on from the end: the newest is kept on
    assert newest is not None and [(c.pos_max, bytes(c.data)) for c in newest.checkpoints] == [(299, second)]
    plain = again.load(saved)
    assert plain is not None and plain.checkpoints == []
    for each in (loaded, newest, plain):
        each.close()  # the file is mapped until then
    path = saved_files(tmp_path)[0]
    with path.open("r+b") as fh:  # cut inside the last checkpoint
        fh.truncate(path.stat().st_size - 3_000)
    assert PromptCache(tmp_path, tiny_gguf, key, budget_bytes=1 << 30).entries == []
    assert not path.exists()


def test_a_stable_checkpoint_comes_back_with_the_newest_one(tmp_path: Path, tiny_gguf: Path) -> None:
    """A checkpoint taken where a request's stable prefix ended keeps its flag on disk, and the restore of
    the next turn (which asks for the newest checkpoint only) brings it back too: the conversation after
    that one goes back to it."""
    key = b"k" * 32
    stable, older, newest = os.urandom(6_000), os.urandom(7_000), os.urandom(8_000)
    cache = PromptCache(tmp_path, tiny_gguf, key, budget_bytes=1 << 30)
    checkpoints = [
        WindowCheckpoint(0, 200, stable, stable=True),
        WindowCheckpoint(20, 259, older),
        WindowCheckpoint(40, 299, newest),
    ]
    cache.save([4] * 310, os.urandom(20_000), checkpoints)
    cache.close()
    [saved] = PromptCache(tmp_path, tiny_gguf, key, budget_bytes=1 << 30).entries
    assert saved.checkpoints == (200, 259, 299)
    loaded = cache.load(saved, windows=1)
    assert loaded is not None
    assert [(c.pos_max, c.stable, bytes(c.data)) for c in loaded.checkpoints] == [
        (200, True, stable),
        (299, False, newest),
    ]
    loaded.close()
    plain = cache.load(saved)  # none asked for: none read, the stable one neither
    assert plain is not None and plain.checkpoints == []
    plain.close()


def test_a_file_of_the_first_format_is_refused_and_removed(tmp_path: Path, tiny_gguf: Path, caplog) -> None:
    """Version 1 files (no window checkpoints) are not read as version 2: removed, logged, evaluated anew."""
    folder = model_folder(tmp_path, tiny_gguf)
    folder.mkdir(parents=True)
    old = folder / f"{'0' * 32}{SUFFIX}"
    old.write_bytes(struct.pack("<8sI32sIQ", b"LMSPKV\x00\x01", 1, b"k" * 32, 0, 0) + b"\x00" * 4)
    assert PromptCache(tmp_path, tiny_gguf, b"k" * 32, budget_bytes=1 << 30).entries == []
    assert not old.exists() and "format version 1" in caplog.text


def test_a_state_is_written_only_while_no_request_runs(tmp_path: Path, tiny_gguf: Path) -> None:
    """The writer waits between slices while the scheduler says a request runs, then finishes."""
    cache = PromptCache(tmp_path, tiny_gguf, b"k" * 32, budget_bytes=1 << 30)
    cache.quiet.clear()  # what the scheduler does while it decodes
    cache.save([5] * 300, os.urandom(5 << 20))  # a few slices
    time.sleep(0.5)
    assert cache.saves == 0 and not saved_files(tmp_path)
    cache.quiet.set()  # idle again
    wait_until(lambda: cache.saves, 30, "the save once idle")
    assert cache.saves == 1 and len(saved_files(tmp_path)) == 1
    cache.close()
    assert cache.best([5] * 301)[1] == 300


def test_a_model_is_quiet_only_while_idle(load, tiny_gguf: Path, tmp_path: Path) -> None:
    model = load(tiny_gguf, options(tmp_path / "pc"))
    cache = model.prompt_cache
    assert cache is not None and cache.quiet.is_set()
    seen: list[bool] = []
    out: queue.Queue = queue.Queue()

    def sink(item: object) -> None:
        seen.append(cache.quiet.is_set())
        out.put(item)

    model.submit(GenerationJob(history(model), SamplingParams(temperature=0.0), 8, sink))
    while not isinstance(out.get(timeout=60), Finish):
        pass
    assert seen and not any(seen)  # never quiet while the request ran
    assert cache.quiet.wait(10), "never quiet after the request"


def test_over_http_the_unloaded_conversation_resumes_from_disk(daemon_factory) -> None:
    import httpx
    from support import TINY_ID, body

    live = daemon_factory(keep_alive=None, parallel=1)
    text = " ".join(WORDS[(i * 5) % len(WORDS)] for i in range(70))  # about 350 tokens in the template
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        before = c.get(f"/models/{TINY_ID}").json()["extensions"]["lmsp_tray"]
        assert before["prompt_cache_bytes"] == 0
        first = c.post("/responses", json=body(text, max_output_tokens=8)).json()
        assert first["usage"]["input_tokens"] >= 256
        c.post(f"/models/{TINY_ID}/unload").raise_for_status()  # the state is written as it unloads
        size = c.get(f"/models/{TINY_ID}").json()["extensions"]["lmsp_tray"]["prompt_cache_bytes"]
        assert size > 0
        again = c.post("/responses", json=body(text + " again", max_output_tokens=8)).json()
    cached = again["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["input_tokens"] - 20  # all but the end of the prompt, restored from disk


def test_an_idle_model_saves_its_sequences_without_unloading(load, tiny_gguf: Path, tmp_path: Path) -> None:
    import time

    cache = tmp_path / "pc"
    model = load(tiny_gguf, options(cache))
    model.scheduler._idle_save_s = 0.2  # 30 s in service
    prompt = history(model)
    generate(model, prompt)
    wait_until(lambda: saved_files(cache), 30, "a save while loaded")
    assert len(saved_files(cache)) == 1  # saved while loaded: a crash now would lose nothing
    _, finish = generate(model, prompt + prompt[1:40])  # the model goes on serving from memory
    assert finish.cached_tokens >= len(prompt)
    wait_until(lambda: len(saved_files(cache)) >= 2, 30, "the new branch saved when idle")
    steps = model.scheduler.steps
    time.sleep(0.6)
    assert model.scheduler.steps == steps  # saving is not decoding
    assert len(saved_files(cache)) == 2  # and a sequence saved as it is is not saved again
