"""A model's scheduler warms llama.cpp up on its own thread at load, and the warm-up leaves nothing behind.

Real llama.cpp on a generated GGUF. The warm-up decodes two tokens on the thread that will
decode every request (llama.cpp's CPU threads belong to the thread that decodes), then forgets
them: the sequence is empty when the model is ready and the first answer is the one a model
without a warm-up gives.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import llama_cpp
import pytest

import lmsp_tray.runner.scheduler as scheduler_module
from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.jobs import Finish, GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.runner.batch import warm_up
from lmsp_tray.runner.model import LlamaModel
from lmsp_tray.runner.runtime import Runtime


def load(path: Path) -> LlamaModel:
    entry = ModelEntry("tiny", path, "custom", path.stat().st_size, (path,), read_gguf_info(path))
    return LlamaModel(Runtime(), entry, LoadOptions(threads=1, parallel=1, speculative=False))


def greedy(model: LlamaModel, prompt: list[int]) -> list[str]:
    out: queue.Queue = queue.Queue()
    model.submit(GenerationJob(prompt, SamplingParams(temperature=0.0), 8, out.put))
    pieces = []
    while not isinstance(item := out.get(timeout=60), Finish):
        pieces.append(item)
    return pieces


def test_the_warm_up_runs_on_the_scheduler_thread_and_leaves_the_sequence_empty(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, bool]] = []

    def recorded(ctx, memory, token: int) -> bool:
        done = warm_up(ctx, memory, token)
        calls.append((threading.current_thread().name, done))
        return done

    monkeypatch.setattr(scheduler_module, "warm_up", recorded)
    model = load(tiny_gguf)
    try:
        assert calls == [("lmsp-model-tiny", True)]  # done, and before the model was handed out
        assert llama_cpp.llama_memory_seq_pos_max(model.memory, 0) == -1
        warmed = greedy(model, model.tokenize_prompt("the weather in the city"))
    finally:
        model.close()
    monkeypatch.setattr(scheduler_module, "warm_up", lambda *_args: True)
    cold = load(tiny_gguf)
    try:
        assert greedy(cold, cold.tokenize_prompt("the weather in the city")) == warmed
    finally:
        cold.close()
