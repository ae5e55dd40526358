"""A model in its own process, at the seam: the load plan goes through, jobs and calls come back.

Real model processes on generated GGUFs (`process.ModelProcess`, no HTTP):
the child loads exactly the plan the service checked against its budget (GPU
layers, window, sequences); generation, cancel, tokenization and markers
work across the pipe; a bad file is a clear load failure; llama.cpp aborting
(`ggml_abort`, what a failed GGML_ASSERT runs) is reported with the failed
assertion; a drained close lets running work finish; a text that cannot fit
the window is refused without being tokenized. The frame codec is checked on
its own.
"""

from __future__ import annotations

import os
import queue
import sys
from pathlib import Path

import pytest
from generation import entry_for, generate
from support import TESTS, wait_until

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine import wire
from lmsp_tray.engine.jobs import CANCELLED, ERROR, LENGTH, Finish, GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions, plan_load
from lmsp_tray.engine.process import ModelProcess
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.errors import ContextLengthExceeded, LMSPError, ModelCrashed, ModelLoadFailed


def test_the_child_loads_the_plan_it_is_given(tiny_gguf: Path) -> None:
    entry = entry_for(tiny_gguf)
    options = LoadOptions(threads=1)
    plan = plan_load(entry, LoadOptions(parallel=3, context_cap=256, gpu_layers=2), gpu_free_bytes=8 << 30, cores=1)
    assert (plan.parallel, plan.context_length, plan.gpu_layers) == (3, 256, 2)
    model = ModelProcess(entry, options, plan)
    try:
        assert model.pid != os.getpid()
        assert (model.parallel, model.context_length) == (3, 256)
        assert (model.placement.device, model.placement.gpu_layers) == ("gpu", 2)  # offload as planned
        assert model.template.name == "model" and "<|im_start|>" in model.template.source
        prompt = model.tokenize_prompt(model.render([{"role": "user", "content": "hello world"}]))
        first = generate(model, prompt, 12)
        text, finish = first
        assert (finish.reason, finish.output_tokens, finish.prompt_tokens) == (LENGTH, 12, len(prompt))
        assert text and first.job.first_token_at is not None
        again, _ = generate(model, prompt, 12)
        assert again == text  # greedy: the same text, the prompt's KV reused
        assert model.find_token("<|im_end|>") is not None and model.find_token("no such marker") is None
        assert model.is_control(model.find_token("<|im_end|>") or 0)
        stats = model.stats(batches=True)
        assert stats.pid == model.pid and stats.steps >= 13 and stats.batch_sizes
        assert stats.accepted > 0  # the second asking drafted the first answer (speculation.Recent)
    finally:
        model.close()
    assert model.exit_error is not None and model.exit_error.code == "service_unavailable"


@pytest.mark.skipif(sys.platform == "win32", reason="sessions and process groups are POSIX")
def test_the_child_shares_the_services_session_but_not_its_process_group(tiny_gguf: Path) -> None:
    """A terminal's Ctrl+C (sent to the service's process group) does not reach the model process, and it
    stays in the service's session, so on Linux in its scheduling group (autogroup): there the service's
    idle-class work (the body worker) yields to the decode instead of taking a group's share of the CPU."""
    entry = entry_for(tiny_gguf)
    model = ModelProcess(entry, LoadOptions(threads=1), plan_load(entry, LoadOptions(), gpu_free_bytes=None, cores=1))
    try:
        assert os.getsid(model.pid) == os.getsid(0)
        assert os.getpgid(model.pid) == model.pid != os.getpgid(0)
        # Where the kernel schedules by autogroup the file names it; where the service runs in a cgroup of its
        # own (a container, a systemd unit) the file is empty and the cgroup is the group: both must match.
        for name in ("autogroup", "cgroup"):
            if os.path.exists(f"/proc/{model.pid}/{name}"):
                with open(f"/proc/{model.pid}/{name}") as child, open(f"/proc/self/{name}") as ours:
                    assert child.read() == ours.read()
    finally:
        model.close()


def test_cancel_crosses_the_pipe_and_a_drained_close_finishes_running_work(slow_gguf: Path) -> None:
    entry = entry_for(slow_gguf, "slow")
    model = ModelProcess(
        entry,
        LoadOptions(threads=1, parallel=2),
        plan_load(entry, LoadOptions(parallel=2), gpu_free_bytes=None, cores=1),
    )
    prompt = model.tokenize_prompt("hello")
    out: queue.Queue = queue.Queue()
    long = GenerationJob(prompt, SamplingParams(temperature=0.0), 100_000, out.put)
    model.submit(long)
    assert isinstance(out.get(timeout=60), str)
    long.cancel()
    while not isinstance(item := out.get(timeout=60), Finish):
        pass
    assert item.reason == CANCELLED and not model.busy
    finishing: queue.Queue = queue.Queue()
    model.submit(GenerationJob(prompt, SamplingParams(temperature=0.0), 200, finishing.put))
    model.close(drain=True)  # waits for it
    items = []
    while not finishing.empty():
        items.append(finishing.get())
    assert isinstance(items[-1], Finish) and items[-1].reason == LENGTH and items[-1].output_tokens == 200


def test_a_text_that_cannot_fit_is_refused_without_tokenizing(tiny_gguf: Path) -> None:
    entry = entry_for(tiny_gguf)
    model = ModelProcess(entry, LoadOptions(threads=1), plan_load(entry, LoadOptions(), gpu_free_bytes=None, cores=1))
    try:
        huge = "the local model " * 500_000  # 8 MB
        with pytest.raises(ContextLengthExceeded) as raised:
            model.tokenize_prompt(huge, at_most=model.context_length)
        assert "at least" in raised.value.detail and raised.value.param == "input"
        assert len(model.tokenize_prompt("the local model " * 5000)) > 5000  # without a limit: tokenized
    finally:
        model.close()


def test_an_unloadable_file_is_a_clear_load_failure(tmp_path: Path, tiny_gguf: Path) -> None:
    broken = tmp_path / "broken.gguf"
    data = tiny_gguf.read_bytes()
    broken.write_bytes(data[: len(data) // 2])  # the header is intact, the tensors are not
    entry = ModelEntry("broken", broken, "custom", len(data) // 2, (broken,), read_gguf_info(tiny_gguf))
    with pytest.raises(ModelLoadFailed) as raised:
        ModelProcess(entry, LoadOptions(threads=1), plan_load(entry, LoadOptions(), gpu_free_bytes=None, cores=1))
    assert "broken" in raised.value.detail


def test_llama_cpp_aborting_is_reported_with_its_assertion(tiny_gguf: Path) -> None:
    entry = entry_for(tiny_gguf)
    exits: list[LMSPError] = []
    model = ModelProcess(
        entry,
        LoadOptions(threads=1),
        plan_load(entry, LoadOptions(), gpu_free_bytes=None, cores=1),
        on_exit=lambda _model, error: exits.append(error),
        command=[sys.executable, str(TESTS / "abort_worker.py")],
    )
    _, finish = generate(model, [1, 2, 3], 5)
    assert finish.reason == ERROR and isinstance(finish.error, ModelCrashed)
    detail = finish.error.detail
    assert "llama.cpp aborted" in detail and "GGML_ASSERT(n_tokens <= n_batch) failed" in detail, detail
    wait_until(lambda: exits, 10, "the manager to hear of the exit")
    assert exits[0] is finish.error  # the manager hears the same reason
    with pytest.raises(ModelCrashed):
        model.tokenize_prompt("after the crash")
    model.close()


def test_frames_survive_any_split() -> None:
    frames = [
        wire.frame(wire.TEXT, 7, "héllo ✓".encode()),
        wire.frame(wire.FINISH, 7, wire.pack_finish(Finish(LENGTH, 3, 4, 1))),
        wire.frame(wire.TOKENS, 9, wire.pack_tokens([1, -2, 2**31 - 1])),
        wire.frame(wire.CANCEL, 2),
    ]
    data = b"".join(frames)
    for chunk in (1, 2, 5, 9, len(data)):
        r, w = os.pipe()
        reader = wire.FrameReader(r, chunk=chunk)
        os.write(w, data)
        os.close(w)
        got = list(reader.frames())
        os.close(r)
        assert [(k, i) for k, i, _ in got] == [(wire.TEXT, 7), (wire.FINISH, 7), (wire.TOKENS, 9), (wire.CANCEL, 2)]
        assert got[0][2].decode() == "héllo ✓"
        assert wire.unpack_finish(got[1][2]) == Finish(LENGTH, 3, 4, 1)
        assert wire.unpack_tokens(got[2][2]) == [1, -2, 2**31 - 1]
    spec, prompt, _ = wire.unpack_job(wire.pack_job({"max_tokens": 5}, [5, 6]))
    assert spec == {"max_tokens": 5} and prompt == [5, 6]
    error = wire.unpack_error(wire.pack_error(ModelCrashed("gone", headers={"Retry-After": "1"})))
    assert isinstance(error, ModelCrashed) and error.detail == "gone" and error.headers == {"Retry-After": "1"}


def test_a_load_reports_its_progress_across_the_pipe(tiny_gguf: Path) -> None:
    """llama.cpp's load progress reaches the service (whole percents, rising, ending at 1) before READY."""
    entry = entry_for(tiny_gguf)
    shares: list[float] = []
    model = ModelProcess(
        entry,
        LoadOptions(threads=1),
        plan_load(entry, LoadOptions(), gpu_free_bytes=None, cores=1),
        on_progress=shares.append,
    )
    try:
        assert shares, "no progress frames before the model was ready"
        assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
        assert len({int(s * 100) for s in shares}) == len(shares)  # no more than one frame per percent
    finally:
        model.close()
