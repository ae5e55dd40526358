"""A fake model factory for `ModelManager`: loads in no time, decodes nothing, crashes on demand.

`ModelManager` takes a model factory; `Factory` makes `FakeModel`s (the way Ollama's
server/sched_test.go fakes its runner), so the manager's and the service's logic (eviction,
budget, keep-alive, crashes, 429) is checked in milliseconds: tests/engine/test_manager_fake.py,
tests/serving/test_service_fake.py. What they stand in for runs for real in the live tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.engine.jobs import GenerationJob
from lmsp_tray.engine.load_plan import LoadOptions, LoadPlan
from lmsp_tray.engine.loaded import ModelStats, Placement
from lmsp_tray.engine.templates import BUILTIN_TEMPLATES, ChatTemplate
from lmsp_tray.errors import LMSPError, ModelCrashed


class FakeModel:
    """A `LoadedModel` that decodes nothing: jobs stay outstanding until `finish_all()`."""

    def __init__(self, entry: ModelEntry, options: LoadOptions, plan: LoadPlan, on_exit) -> None:
        self.id = entry.id
        self.entry = entry
        self.plan = plan
        self.loaded_at = time.time()
        self.load_seconds = 0.0
        self.context_length = plan.context_length
        self.parallel = plan.parallel
        self.placement = Placement("cpu", 0, plan.total_layers, plan.threads, "fake")
        self.template = ChatTemplate(BUILTIN_TEMPLATES["chatml"], "chatml")
        self.sliding_window = False
        self.jobs: list[GenerationJob] = []
        self.closed: list[bool] = []  # drain flags of close() calls
        self._on_exit = on_exit
        self._last = time.monotonic()

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    @property
    def last_activity(self) -> float:
        return self._last

    def render(self, messages, **kwargs) -> str:
        return self.template.render(messages, **kwargs)

    def find_token(self, text: str) -> int | None:
        return None

    def is_control(self, token: int) -> bool:
        return False

    def tokenize_prompt(self, text: str, *, at_most: int | None = None) -> list[int]:
        return [ord(c) for c in text]

    def longest_piece(self) -> int:
        return 4  # a token a character: at most 4 bytes of UTF-8

    def measure(self, prompt: Sequence[int], media: Sequence[Any]) -> int:
        return len(prompt)

    def submit(self, job: GenerationJob) -> None:
        self.jobs.append(job)
        self._last = time.monotonic()

    def finish_all(self) -> None:
        self.jobs.clear()
        self._last = time.monotonic()

    def stats(self, *, batches: bool = False) -> ModelStats:
        return ModelStats(generating=len(self.jobs))

    def close(self, *, drain: bool = False) -> None:
        self.closed.append(drain)

    def crash(self, why: str = "ended with SIGKILL") -> None:
        self._on_exit(self, ModelCrashed(f"The model '{self.id}' stopped: {why}."))


class Factory:
    def __init__(self) -> None:
        self.made: list[FakeModel] = []
        self.fail: dict[str, LMSPError] = {}
        self.gate: threading.Event | None = None  # when set, loads wait for it

    def __call__(self, entry: ModelEntry, options: LoadOptions, plan: LoadPlan, on_exit, on_progress=None) -> FakeModel:
        if self.gate is not None:
            self.gate.wait(10)
        if entry.id in self.fail:
            raise self.fail[entry.id]
        model = FakeModel(entry, options, plan, on_exit)
        self.made.append(model)
        return model
