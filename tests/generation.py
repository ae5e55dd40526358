"""One generation job run to its end, on a model in process or in a model process (no HTTP).

The tests of the model process and what runs inside it (tests/engine/test_model_process.py,
tests/runner/: prompt cache, swa, speculation, grammars) all submit a `GenerationJob` and read its
sink until the `Finish`; `generate` is that one way, `entry_for` the catalog entry of a GGUF file.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp_tray.discovery.entry import ModelEntry
from lmsp_tray.discovery.gguf_header import read_gguf_info
from lmsp_tray.engine.jobs import Finish, GenerationJob, TokenLogprob
from lmsp_tray.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def entry_for(path: Path, model_id: str = "tiny") -> ModelEntry:
    return ModelEntry(model_id, path, "custom", path.stat().st_size, (path,), read_gguf_info(path))


@dataclass
class Generated:
    """What one job's sink received, in order, and how it ended; unpacks as `text, finish`."""

    items: list[Any]
    finish: Finish
    job: GenerationJob

    @property
    def text(self) -> str:
        return "".join(item for item in self.items if isinstance(item, str))

    @property
    def steps(self) -> list[tuple[bytes, float]]:
        """(piece, logprob) of each token, for jobs run with `logprobs=`."""
        return [(item.piece, item.logprob) for item in self.items if isinstance(item, TokenLogprob)]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.text, self.finish))


def generate(
    model: Any,
    prompt: list[int],
    tokens: int = 16,
    sampling: SamplingParams = GREEDY,
    *,
    timeout: float = 60,
    **job: Any,
) -> Generated:
    """Submit one job of `tokens` at most to `model` (anything with `submit`) and wait for its `Finish`."""
    out: queue.Queue = queue.Queue()
    generation = GenerationJob(prompt, sampling, tokens, out.put, **job)
    model.submit(generation)
    items = []
    while not isinstance(item := out.get(timeout=timeout), Finish):
        items.append(item)
    return Generated(items, item, generation)
