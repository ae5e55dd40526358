"""The draft model a model's settings name, as the service plans it: found by id, checked from the headers,
counted in memory (weights and a KV cache as the model's), and left out — saying why — where it is missing,
of another vocabulary, or does not fit the budget (the model then loads without it, never refused)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fake_models import Factory

from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.drafts import DraftRefused, check_draft
from lmsp_tray.engine.load_plan import LoadOptions, ModelLoad
from lmsp_tray.engine.manager import MemoryBudget, ModelManager

MB = 1024 * 1024


def entry(name: str, size_mb: int, *, vocab: int = 32000, blocks: int = 8, bos: str = "<s>") -> ModelEntry:
    info = GGUFInfo(
        architecture="llama",
        context_length=2048,
        block_count=blocks,
        head_count_kv=4,
        head_count=8,
        embedding_length=512,
        vocab_size=vocab,
        bos_token=bos,
        eos_token="</s>",
        tensor_count=10,
    )
    return ModelEntry(name, Path(f"/models/{name}.gguf"), "custom", size_mb * MB, (), info)


MAIN, SMALL = entry("main", 400), entry("small", 40, blocks=2)
KNOWN = {e.id: e for e in (MAIN, SMALL, entry("other", 40, vocab=32001), entry("bos", 40, bos="<|s|>"))}


def manager(draft: str, **kwargs) -> ModelManager:
    return ModelManager(
        None,
        LoadOptions(parallel=2, threads=1),
        factory=Factory(),
        cores=2,
        per_model={"main": ModelLoad(draft=draft)},
        find=KNOWN.get,
        **kwargs,
    )


def test_the_draft_is_counted_in_memory_and_handed_to_the_model_process() -> None:
    m = manager("small")
    try:
        bare = dataclasses.replace(m.plan(MAIN), draft_bytes=0)
        plan = m.plan(MAIN)
        assert plan.draft_id == "small" and plan.draft_path == str(SMALL.path) and plan.draft_skipped is None
        kv = SMALL.info.kv_bytes_per_token() * plan.context_length * plan.parallel  # type: ignore[union-attr]
        assert plan.draft_bytes == SMALL.size_bytes + kv
        assert plan.ram_bytes == bare.ram_bytes + plan.draft_bytes
        loaded = m.acquire(MAIN)
        assert loaded.plan.draft_path == str(SMALL.path)
    finally:
        m.close()


def test_a_draft_that_does_not_fit_the_budget_is_left_out_and_the_model_loads() -> None:
    probe = manager("small")
    plan = probe.plan(MAIN)
    probe.close()
    m = manager("small", budget=MemoryBudget(ram_bytes=plan.ram_bytes - plan.draft_bytes + MB))
    try:
        loaded = m.acquire(MAIN)
        assert loaded.plan.draft_path is None and loaded.plan.draft_bytes == 0
        assert "did not fit" in (loaded.plan.draft_skipped or "") and "'small'" in (loaded.plan.draft_skipped or "")
    finally:
        m.close()


@pytest.mark.parametrize(
    ("draft", "says"),
    [
        ("nowhere", "was not found"),
        ("main", "is the model itself"),
        ("other", "another vocabulary (32,001 tokens, the model 32,000)"),
        ("bos", "another vocabulary (start and end tokens '<|s|>'"),
    ],
)
def test_an_unusable_draft_is_refused_with_its_reason_and_the_model_loads(draft: str, says: str) -> None:
    with pytest.raises(DraftRefused, match="draft model"):
        check_draft(MAIN, draft, KNOWN.get(draft))
    m = manager(draft)
    try:
        loaded = m.acquire(MAIN)
        assert loaded.plan.draft_path is None and says in (loaded.plan.draft_skipped or "")
    finally:
        m.close()


def test_a_draft_not_smaller_than_the_model_is_refused() -> None:
    with pytest.raises(DraftRefused, match="not smaller"):
        check_draft(SMALL, "main", MAIN)
