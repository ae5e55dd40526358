"""Sliding-window layers keep only their window, and checkpoints of it let a sequence go back.

Why: Gemma 3 and other models attend over a sliding window of `n_swa` positions in
most layers. Keeping every position in those layers too (llama.cpp's `swa_full`) lets
any prefix of a sequence be reused, but makes each prompt token attend over the whole
history there: llama-server itself evaluates a 5,400-token conversation on Gemma 3
270M 1.15x slower with `--swa-full` than without (7.41 vs 6.45 s, 4 rounds each,
interleaved). So those layers keep their window only, as llama-server does by default.

The cost is going back: a sequence can go on from position `p` only while its
window layers still hold the positions before `p` that `p` attends to. Going on from
the end (the next turn of a conversation, rejected speculative drafts) always can;
going back further (regenerating a long reply, editing the last message) needs a
**checkpoint**: a copy of the window layers' cells (llama.cpp's partial sequence
state, ~16 MiB on Gemma 3 270M) taken when a prompt has been evaluated. A sequence
keeps its last `CHECKPOINTS`; with none that fits, the prompt is evaluated again from
the start. The same rule, and the same kind of checkpoints, as llama-server's. They
are saved with the sequence's state in the prompt cache, and come back with it.

A new conversation shares with the last one only its fixed prefix (the system prompt
and tools: Claude Code's next session), which ends far from any of those. So where a
request says its stable prefix ends, one more checkpoint is taken there, and kept
(one a sequence) beside the last `CHECKPOINTS` for as long as the sequence goes on
past it: the next conversation goes back to it, after a restart too.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import llama_cpp

from lmsp_tray.runner.prompt_cache import WindowCheckpoint

log = logging.getLogger("lmsp_tray.runner")

CHECKPOINTS = 2  # per sequence: the last prompt's, and the one before (editing the last message)
TAIL = 32  # a long prompt's last tokens, fed after its checkpoint: regenerating the answer evaluates them
SHORT = 256  # a prompt adding no more tokens than this is checkpointed before any of them is fed


def checkpoint_tail(pending: int) -> int:
    """How many of a prompt's `pending` tokens go in after its checkpoint. A checkpoint taken after the
    whole prompt cannot serve a regenerated answer (that goes on from the prompt's last token but one),
    so it is taken before the last `TAIL`, at the cost of one more decode; a short addition (the next
    turn of a chat) is checkpointed before it starts, which costs no decode at all."""
    return TAIL if pending > SHORT else pending


CHECKPOINT_BYTES = 1 << 30  # all sequences' checkpoints together; the oldest go first (a 12B model's are
# about 0.3 GiB each, Gemma 3 270M's 7.5 MiB)
PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass
class Checkpoint:
    pos_min: int  # the first and last positions its window cells hold
    pos_max: int
    data: ctypes.Array[ctypes.c_uint8]
    taken: int = 0  # order of taking, for the byte budget
    stable: bool = False  # where the request's stable prefix ends: kept beside the last `CHECKPOINTS`


_C = TypeVar("_C", Checkpoint, WindowCheckpoint)


@dataclass
class Windows:
    """The window layers' checkpoints of every sequence of one context (scheduler thread only)."""

    ctx: llama_cpp.llama_context_p
    memory: llama_cpp.llama_memory_t
    n_swa: int
    checkpoints: dict[int, list[Checkpoint]] = field(default_factory=dict)
    budget_bytes: int = CHECKPOINT_BYTES
    restored: int = 0  # checkpoints brought back, and prompts evaluated again for want of one
    reset: int = 0
    taken: int = 0

    def resume_at(self, seq_id: int, keep: int) -> int:
        """How much of the sequence's first `keep` positions can stay: `keep` while its window cells
        reach back far enough, else what a checkpoint restores (a little less), else 0. Checkpoints
        holding positions from the answer on are dropped (those positions are about to change)."""
        if keep > 0 and not self._reaches(llama_cpp.llama_memory_seq_pos_min(self.memory, seq_id), keep):
            usable = [c for c in self.checkpoints.get(seq_id, ()) if c.pos_max < keep]
            best = max(usable, key=lambda c: c.pos_max, default=None)
            size = len(best.data) if best is not None else 0
            if best is not None and llama_cpp.llama_state_seq_set_data_ext(self.ctx, best.data, size, seq_id, PARTIAL):
                keep = best.pos_max + 1
                self.restored += 1
            else:
                log.info("sequence %d: evaluating the prompt again (its window layers no longer reach back)", seq_id)
                keep = 0
                self.reset += 1
        self.drop(seq_id, before=keep)
        return keep

    def take(self, seq_id: int, *, stable: bool = False) -> None:
        """Checkpoint the sequence as it is now (a prompt just evaluated, or its `stable` prefix), when
        it is past the window."""
        pos_min = llama_cpp.llama_memory_seq_pos_min(self.memory, seq_id)
        pos_max = llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id)
        if pos_max < self.n_swa or not self._reaches(pos_min, pos_max + 1):
            return
        size = llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq_id, PARTIAL)
        if not size or size > self.budget_bytes:
            return
        kept = [c for c in self.checkpoints.get(seq_id, ()) if c.pos_max < pos_max and not (stable and c.stable)]
        self.checkpoints[seq_id] = _bounded(kept, room=0 if stable else 1)  # one stable one a sequence
        self._fit(self.budget_bytes - size)
        data = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self.ctx, data, size, seq_id, PARTIAL) != size:
            return
        self.taken += 1
        self.checkpoints[seq_id].append(Checkpoint(pos_min, pos_max, data, self.taken, stable))

    def saved(self, seq_id: int) -> list[WindowCheckpoint]:
        """The sequence's checkpoints as the prompt cache saves them beside its state."""
        return [
            WindowCheckpoint(c.pos_min, c.pos_max, memoryview(c.data).cast("B"), c.stable)
            for c in self.checkpoints.get(seq_id, ())
        ]

    def adopt(self, seq_id: int, saved: list[WindowCheckpoint]) -> None:
        """Make checkpoints restored from the prompt cache the sequence's own (within the byte budget,
        the newest kept, and the newest stable one)."""
        self.drop(seq_id)
        keep = _bounded(sorted(saved, key=lambda c: c.pos_max))
        size = sum(len(c.data) for c in keep)
        if not keep or size > self.budget_bytes:
            return
        self._fit(self.budget_bytes - size)
        for c in keep:
            self.taken += 1
            n = len(c.data)
            if isinstance(c.data, bytearray):  # read for it alone: its buffer becomes the checkpoint's
                data = (ctypes.c_uint8 * n).from_buffer(c.data)
            else:
                data = (ctypes.c_uint8 * n).from_buffer_copy(c.data)
            checkpoint = Checkpoint(c.pos_min, c.pos_max, data, self.taken, c.stable)
            self.checkpoints.setdefault(seq_id, []).append(checkpoint)

    def _fit(self, room: int) -> None:
        """Drop the oldest checkpoints of any sequence until the rest take at most `room` bytes."""
        every = sorted((c.taken, seq, c) for seq, cs in self.checkpoints.items() for c in cs)
        used = sum(len(c.data) for _, _, c in every)
        for _, seq, c in every:
            if used <= room:
                return
            self.checkpoints[seq].remove(c)
            used -= len(c.data)

    def drop(self, seq_id: int, *, before: int = 0) -> None:
        """Forget the sequence's checkpoints except those wholly before position `before` (all: 0)."""
        kept = [c for c in self.checkpoints.get(seq_id, ()) if c.pos_max < before]
        if kept:
            self.checkpoints[seq_id] = kept
        else:
            self.checkpoints.pop(seq_id, None)

    def saved_serves(self, length: int, checkpoints: Sequence[int], keep: int) -> int:
        """How much of its first `keep` positions a state saved with `length` positions, and window
        checkpoints ending at `checkpoints`, can serve. llama.cpp saves only the live window cells (the
        last `n_swa` positions), so the state itself goes on only from its end, or one before; from
        further back, only a checkpoint saved with it serves."""
        if self._reaches(max(0, length - self.n_swa), keep):
            return keep
        return max((pos + 1 for pos in checkpoints if pos < keep), default=0)

    def _reaches(self, pos_min: int, pos: int) -> bool:
        """Do window cells from `pos_min` on hold every position the token at `pos` attends to? (llama.cpp
        masks a position `n_swa` or more before it; a chunked window starts later, never earlier.)"""
        return pos_min <= 0 or pos_min <= pos - self.n_swa + 1


def _bounded(checkpoints: Sequence[_C], *, room: int = 0) -> list[_C]:
    """What a sequence keeps of its `checkpoints` (in position order), leaving `room` for as many new
    ones: the newest `CHECKPOINTS`, and the newest stable one besides."""
    plain: list[_C] = [c for c in checkpoints if not c.stable]
    kept: list[_C] = plain[-(CHECKPOINTS - room) :] if CHECKPOINTS > room else []
    stable: list[_C] = [c for c in checkpoints if c.stable][-1:]
    both = stable + kept
    return sorted(both, key=lambda c: c.pos_max)
