"""Will this model run well here? The load planner's answer, put the way LM Studio puts it.

Before a download the header is read from the Hub (`remote_header`), after it
from the file; either way `assess` asks the same planner the model manager
loads with (`engine.load_plan.plan_load`: GPU layers that fit, context window,
parallel sequences, KV cache) and compares its memory with the same budget
that answers `507 insufficient_memory` at load time. Verdicts:

- ``full_gpu_offload``: "full GPU offload possible";
- ``partial_gpu_offload``: "partial GPU offload (N of M layers)";
- ``fits_in_ram``: runs on the CPU within the memory budget;
- ``too_large``: needs more than the budget (a load would be refused);
- with no header (it could not be read) the same verdicts come from the file
  size alone, marked ``estimated_from: "size"``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.load_plan import LoadOptions, plan_load
from lmsp_tray.hub.space import gb

FULL_GPU = "full_gpu_offload"
PARTIAL_GPU = "partial_gpu_offload"
FITS_IN_RAM = "fits_in_ram"
TOO_LARGE = "too_large"


@dataclass(frozen=True)
class Machine:
    """What the planner compares against: the budgets the model manager uses, and the GPU's free memory."""

    ram_budget: int | None  # bytes loaded models may use (None: unknown, unlimited)
    vram_budget: int | None = None
    gpu_free: int | None = None  # None: no usable GPU (or offload turned off)
    cores: int = 1
    ram_total: int | None = None

    @classmethod
    def this_one(
        cls, *, fraction: float = 0.75, gpu_free: int | None = None, vram_total: int | None = None, cores: int = 0
    ) -> Machine:
        total = total_ram()
        return cls(
            ram_budget=None if total is None else int(total * fraction),
            vram_budget=None if not vram_total else int(vram_total * fraction),
            gpu_free=gpu_free,
            cores=cores or os.cpu_count() or 1,
            ram_total=total,
        )


@dataclass(frozen=True)
class Fit:
    verdict: str
    summary: str  # one line for a person
    ram_bytes: int
    vram_bytes: int
    gpu_layers: int
    total_layers: int
    context_length: int
    estimated_from: str  # "header" | "size"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "ram_bytes": self.ram_bytes,
            "vram_bytes": self.vram_bytes,
            "gpu_layers": self.gpu_layers,
            "total_layers": self.total_layers,
            "context_length": self.context_length,
            "estimated_from": self.estimated_from,
        }


def total_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def assess(info: GGUFInfo | None, size_bytes: int, options: LoadOptions, machine: Machine) -> Fit:
    """The planner's verdict for a model of `size_bytes` with header `info` (None: size only)."""
    entry = ModelEntry(
        id="candidate", path=Path("candidate.gguf"), source="huggingface", size_bytes=size_bytes, info=info
    )
    plan = plan_load(entry, options, gpu_free_bytes=machine.gpu_free, cores=machine.cores)
    source = "header" if info is not None and info.block_count else "size"
    about = "" if source == "header" else " (estimated from the file size)"
    layers = plan.total_layers
    if machine.ram_budget is not None and plan.ram_bytes > machine.ram_budget:
        verdict, summary = (
            TOO_LARGE,
            (
                f"too large for this machine: needs about {gb(plan.ram_bytes)} of memory, the budget for models is "
                f"{gb(machine.ram_budget)}{about}"
            ),
        )
    elif plan.on_gpu and plan.gpu_layers >= layers:
        verdict, summary = FULL_GPU, f"full GPU offload possible (about {gb(plan.vram_bytes)} of GPU memory){about}"
    elif plan.on_gpu:
        verdict, summary = (
            PARTIAL_GPU,
            (
                f"partial GPU offload: {plan.gpu_layers} of {layers} layers on the GPU, about {gb(plan.ram_bytes)} "
                f"in RAM{about}"
            ),
        )
    else:
        where = "fits in RAM" if machine.gpu_free is None else "fits in RAM (too big for the GPU)"
        verdict, summary = FITS_IN_RAM, f"{where}: about {gb(plan.ram_bytes)} on the CPU{about}"
    return Fit(
        verdict=verdict,
        summary=summary,
        ram_bytes=plan.ram_bytes,
        vram_bytes=plan.vram_bytes,
        gpu_layers=plan.gpu_layers,
        total_layers=layers,
        context_length=plan.context_length,
        estimated_from=source,
    )
