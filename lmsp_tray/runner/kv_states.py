"""A sequence's KV state between a llama.cpp context and the prompt cache on disk.

What the scheduler asks of the prompt cache (`prompt_cache`), on the thread that
owns the context: `open_cache` keys a model's cache by everything that shapes its
KV; `save` copies a sequence's state (and its window checkpoints) out of the
context, a memory copy (23.6 MiB for a 5,400-token conversation on Gemma 3 270M),
for the cache's writer; `restore_best` picks the saved state that serves the most
of a prompt and loads it (`restore`: a checked file's state into a sequence,
removed when llama.cpp will not take it).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from lmsp_tray.runner.prompt_cache import MIN_TOKENS, PromptCache, Saved, WindowCheckpoint, cache_key
from lmsp_tray.runner.swa import Windows

log = logging.getLogger("lmsp_tray.runner")

RESTORE_GAIN = 64  # a saved state is restored when it covers this many more prompt tokens than memory


def open_cache(
    root: Path, model_path: Path, budget: int, *, context_per_sequence: int, cparams: Any, gpu_layers: int
) -> PromptCache:
    """A model's saved states, keyed by its file and everything that shapes its KV cache (OSError when
    the file cannot be read)."""
    params = {
        "context_per_sequence": context_per_sequence,
        "type_k": cparams.type_k,
        "type_v": cparams.type_v,
        "flash_attn": cparams.flash_attn_type,
        "rope": (cparams.rope_scaling_type, cparams.rope_freq_base, cparams.rope_freq_scale),
        "yarn": (cparams.yarn_ext_factor, cparams.yarn_attn_factor, cparams.yarn_orig_ctx),
        "swa_full": cparams.swa_full,
        "kv_unified": cparams.kv_unified,
        "gpu_layers": gpu_layers,
        "llama_cpp": llama_cpp.__version__,
    }
    return PromptCache(root, model_path, cache_key(model_path, params), budget)


def save(
    ctx: llama_cpp.llama_context_p, seq_id: int, cache: PromptCache, tokens: Sequence[int], windows: Windows | None
) -> None:
    """Hand sequence `seq_id`'s state (holding `tokens`) and its window checkpoints to the cache's writer,
    unless it is too short to be worth a file or already saved."""
    if len(tokens) >= MIN_TOKENS and not cache.holds(tokens):
        state = copy_out(ctx, seq_id)
        if state is not None:
            cache.save(tokens, state, windows.saved(seq_id) if windows else ())


def restore_best(
    ctx: llama_cpp.llama_context_p,
    memory: llama_cpp.llama_memory_t,
    seq_id: int,
    cache: PromptCache,
    windows: Windows | None,
    prompt: Sequence[int],
    held: int,
) -> tuple[int, ...] | None:
    """Load the saved state that serves the most of `prompt` into sequence `seq_id`, when it serves
    `RESTORE_GAIN` more tokens than the `held` the sequence already shares with it. The tokens the
    sequence now holds: the state's, or none (emptied) when its file failed; None when nothing changed."""

    def usable(saved: Saved, shared: int) -> int:
        keep = min(shared, len(prompt) - 1)
        return keep if windows is None else windows.saved_serves(len(saved.tokens), saved.checkpoints, keep)

    saved, keep = cache.best(prompt, usable)
    if saved is None or keep < held + RESTORE_GAIN:
        return None
    if windows is not None:
        windows.drop(seq_id)
    back = keep < len(saved.tokens) - 1  # needs a checkpoint; else the newest goes on with the sequence
    wanted = 0 if windows is None else len(saved.checkpoints) if back else 1
    checkpoints = restore(ctx, memory, seq_id, cache, saved, windows=wanted)
    if checkpoints is None:
        return ()
    if windows is not None:
        windows.adopt(seq_id, checkpoints)
    return saved.tokens


def copy_out(ctx: llama_cpp.llama_context_p, seq_id: int) -> memoryview | None:
    """Sequence `seq_id`'s state as llama.cpp serializes it (None when it has none)."""
    size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
    if not size:
        return None
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id)
    return memoryview(buf).cast("B")[:n] if n else None


def restore(
    ctx: llama_cpp.llama_context_p,
    memory: llama_cpp.llama_memory_t,
    seq_id: int,
    cache: PromptCache,
    saved: Saved,
    *,
    windows: int = 0,
) -> list[WindowCheckpoint] | None:
    """Replace sequence `seq_id`'s KV with the state of `saved`, and give back the newest `windows`
    window checkpoints saved with it; None (the sequence left empty) when the file fails its checks
    or llama.cpp refuses it."""
    llama_cpp.llama_memory_seq_rm(memory, seq_id, -1, -1)
    loaded = cache.load(saved, windows=windows)
    if loaded is None:
        return None
    state = (ctypes.c_uint8 * len(loaded.state)).from_buffer(loaded.state)
    taken = llama_cpp.llama_state_seq_set_data(ctx, state, len(loaded.state), seq_id) != 0
    del state  # llama.cpp has copied it: the file's mapping can go
    loaded.close()
    if not taken:
        llama_cpp.llama_memory_seq_rm(memory, seq_id, -1, -1)
        cache.refuse(saved, "llama.cpp would not load it")
        return None
    return loaded.checkpoints
