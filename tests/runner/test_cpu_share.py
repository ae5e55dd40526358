"""Decode threads yield to other programs' busy cores (runner/cpu_share.py): the rule, the machine's
real figures under real busy processes, and the count reaching llama.cpp's context."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp
import pytest
from generation import entry_for, generate
from support import wait_until

from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.runner import model as model_module
from lmsp_tray.runner.cpu_share import CpuSeconds, YieldingThreads, logical_cpus, read_cpu_seconds, threads_for
from lmsp_tray.runner.model import LlamaModel
from lmsp_tray.runner.runtime import Runtime


@pytest.mark.parametrize(
    ("others", "cpus", "most", "threads"),
    [
        (0.0, 2, 2, 2),  # a quiet machine: the plan's count
        (0.3, 2, 2, 2),  # a background program using a third of a core does not cost a thread
        (0.67, 2, 2, 1),  # a busy process beside two spinning threads gets two thirds of a core
        (1.0, 2, 2, 1),
        (2.0, 2, 2, 1),  # never none
        (3.0, 16, 8, 8),  # hyper-threads left free: the plan's count still fits
        (10.0, 16, 8, 6),
    ],
)
def test_the_free_cpus_rounded_within_one_and_the_plan(others: float, cpus: int, most: int, threads: int) -> None:
    assert threads_for(others, cpus, most) == threads


class Machine:
    """A clock and CPU counters the test moves by hand."""

    def __init__(self) -> None:
        self.now, self.machine, self.own = 0.0, 0.0, 0.0

    def read(self) -> CpuSeconds:
        return CpuSeconds(self.machine, self.own)

    def advance(self, seconds: float, *, others: float, own: float) -> None:
        self.now += seconds
        self.machine += (others + own) * seconds
        self.own += own * seconds


def test_others_use_is_the_machines_less_this_process_read_every_interval() -> None:
    m = Machine()
    threads = YieldingThreads(2, read=m.read, clock=lambda: m.now, cpus=2)
    m.advance(0.6, others=0.0, own=2.0)  # the model spinning on both cores is its own use
    assert threads.threads() == 2 and threads.others == pytest.approx(0.0)
    m.advance(0.6, others=0.7, own=1.3)
    assert threads.threads() == 1 and threads.others == pytest.approx(0.7)
    m.advance(0.2, others=0.0, own=1.0)  # within the interval: unchanged, not read
    assert threads.threads() == 1
    m.advance(0.4, others=0.0, own=1.0)
    assert threads.threads() == 2
    m.advance(0.6, others=1.0, own=1.0)
    assert threads.threads() == 1
    m.advance(30.0, others=1.0, own=0.0)  # no decode for half a minute (a build ran, then stopped)
    assert threads.threads() == 2  # that window is not measured: the plan's count, read again from here
    m.advance(0.6, others=0.0, own=2.0)
    assert threads.threads() == 2 and threads.others == pytest.approx(0.0)


def test_the_service_that_started_the_model_process_counts_as_its_own(tmp_path: Path) -> None:
    """Relaying tokens is the service's share of a stream: not another program's."""
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "stat").write_text(f"cpu  {3 * ticks} 0 {ticks} 500 7 0 0 0 0 0\ncpu0 1 2 3\n")
    (tmp_path / str(os.getppid())).mkdir()
    fields = ["S", "1", *["0"] * 9, str(2 * ticks), str(ticks), *["0"] * 30]
    (tmp_path / str(os.getppid()) / "stat").write_text(f"{os.getppid()} (lmsp tray) serve) {' '.join(fields)}\n")
    sample = read_cpu_seconds(str(tmp_path / "stat"))
    assert sample is not None and sample.machine == pytest.approx(4.0)
    own = os.times()
    assert sample.own == pytest.approx(own.user + own.system + 3.0, abs=0.05)


def test_nothing_to_read_keeps_the_plan() -> None:
    threads = YieldingThreads(4, read=lambda: None, cpus=8, interval=0.0)
    assert threads.threads() == 4
    assert read_cpu_seconds("/nonexistent/stat") is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux's /proc/stat")
def test_busy_processes_on_this_machine_take_threads_and_give_them_back() -> None:
    """Real figures: with a busy process on every CPU but one, the count drops to one; without, the plan's."""
    cpus = logical_cpus()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus - 1)]
    try:
        time.sleep(0.3)
        threads = YieldingThreads(cpus, interval=0.5)  # a window that starts with them running
        time.sleep(0.8)
        assert threads.threads() == 1, threads.others
        assert threads.others > cpus - 1.5
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()

    # Given back: the plan's count once a half second passes quiet. The tests' own machine is not always
    # quiet (a noisy neighbour's steal time counts as busy, as it should): any quiet window in 30 s does.
    def measured() -> int:  # one real half-second window (the first call only says the plan's count)
        threads = YieldingThreads(cpus, interval=0.5)
        time.sleep(0.6)
        return threads.threads()

    wait_until(lambda: measured() == cpus, 30, f"the count back at {cpus}", interval=0)


def test_the_count_reaches_the_context_and_leaves_the_text_alone(slow_gguf: Path, monkeypatch) -> None:
    """The scheduler sets the count on llama.cpp's context before a decode; greedy text is the same with
    one thread as with the plan's. An explicit `threads` is kept as given."""
    entry = entry_for(slow_gguf)
    prompt = list(range(10, 40))
    planned = LlamaModel(Runtime(), entry, LoadOptions(threads=2, speculative=False))
    try:
        assert planned.scheduler is not None and planned.scheduler.threads_used == 0  # given: not adapted
        expected = generate(planned, prompt, 48).text
        assert llama_cpp.llama_n_threads(planned.ctx) == 2
    finally:
        planned.close()

    m = Machine()

    def busy_desktop(most: int) -> YieldingThreads:
        def read() -> CpuSeconds:
            m.advance(1.0, others=3.0, own=1.0)  # three of four CPUs busy with other programs
            return m.read()

        return YieldingThreads(most, read=read, clock=lambda: m.now, cpus=4)

    monkeypatch.setattr(model_module, "YieldingThreads", busy_desktop)
    yielding = LlamaModel(Runtime(), entry, LoadOptions(speculative=False))
    try:
        scheduler = yielding.scheduler
        assert scheduler is not None
        assert generate(yielding, prompt, 48).text == expected
        assert scheduler.threads_used == 1
        assert llama_cpp.llama_n_threads(yielding.ctx) == 1
    finally:
        yielding.close()
