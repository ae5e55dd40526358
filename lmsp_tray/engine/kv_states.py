"""Copying one sequence's KV state out of a llama.cpp context, and back into one.

The two llama.cpp calls the prompt cache (`prompt_cache`) needs, on the thread
that owns the context: `copy_out` is a memory copy (23.6 MiB for a 5,400-token
conversation on Gemma 3 270M), `restore` loads a checked file's state into a sequence (and hands back the
window checkpoints saved with it) and removes the file when llama.cpp will not
take it.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp

from lmsp_tray.engine.prompt_cache import PromptCache, Saved, WindowCheckpoint

log = logging.getLogger("lmsp_tray.engine")


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
