"""Sequence states on disk: a prompt cache that outlives a model's unload and the service itself.

Re-reading a long conversation costs seconds on a laptop CPU (about 3.5 ms a
token on two cores). When a model unloads — keep-alive, eviction, Quit,
SIGTERM — and whenever it sits idle, each sequence's KV state (llama.cpp's
per-sequence state) is written here with the tokens it holds; a later load
restores the one sharing the longest prefix with a new prompt instead of
evaluating that prefix again.

One file per saved sequence, in a folder per model file (named by a hash of
its path), named by a hash of its tokens:

    magic "LMSPKV" 0 1 | version u32 | key (32 bytes) | tokens u32 | state bytes u64
    | checkpoints u32 | tokens (int32 each) | per checkpoint: first and last position
    (int32 each), bytes u64, CRC-32 of its bytes (u32), flags (u32: 1 = stable) | state
    | CRC-32 of everything before (u32) | each checkpoint's bytes

A sliding-window model's state holds only the window's last cells, so it can go
on only from its end; the sequence's window checkpoints (`swa`) travel with it,
so that regenerating the last reply or editing the last message after an unload
or a restart goes back to a checkpoint instead of evaluating the whole
conversation again. A *stable* checkpoint marks where a request said its prefix
stays the same across conversations (its system prompt and tools): a new
conversation sharing it — Claude Code's next session — goes on from there. They
come last, with checksums of their own, so the usual restore (the next turn,
which goes on from the end) reads only the newest one and the stable one besides
the state (the sequence keeps them: the next save carries them on).

The key is a hash of the model file's identity (path, size, modification
time) and of everything that shapes the KV cache (context per sequence, KV
types, flash attention, RoPE settings, llama.cpp's version and this format's
version): a file whose key differs — other settings, a changed model file,
a file from another model — is never loaded, and it is removed and logged,
as is a truncated or corrupt one (its checksum is checked before a restore).

Writes happen on a background thread, never on the decoding thread (which only
copies the state out of the context, a memory copy), and only while the model is
quiet: the scheduler says when no request runs (`quiet`), and the writer writes in
slices of `SLICE` bytes, waiting between slices while a request runs, at a low
scheduling priority. On two cores, writing states back to back beside a decode
made its median gap between tokens 1.8x longer and its p99 6.4x
(`benchmarks/save_stall.py`); a decode must not pay for a save. A restore reads and
checks the file on the decoding thread, which is what the next turn waits
for anyway. The whole cache folder is kept under a byte budget: after each
write the least recently used files (a restore counts as a use) go first.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import queue
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lmsp_tray.engine.cache_folders import SUFFIX, folder_bytes, model_folder
from lmsp_tray.priority import lower_thread

log = logging.getLogger("lmsp_tray.runner.prompt_cache")

MAGIC = b"LMSPKV\x00\x01"
FORMAT_VERSION = 3  # 2: window checkpoints; 3: their flags (older files are refused and removed)
_HEAD = struct.Struct("<8sI32sIQI")
_CHECKPOINT = struct.Struct("<iiQII")
STABLE = 1  # a checkpoint's flag: taken where a request's stable prefix ends
_SUM = 4  # a CRC-32: catches a flipped byte or a torn write, and checks 100 MB in a few dozen ms
_CRC = struct.Struct("<I")
MIN_TOKENS = 256  # shorter sequences are cheap to evaluate again: not worth a file
SLICE = 2 << 20  # bytes written between two looks at whether a request has started
WRITER_NICE = 10  # the writer thread's niceness (Linux): a decode gets the cores first


def cache_key(model_path: Path, params: dict[str, object]) -> bytes:
    """The 32-byte key of a model file as loaded with `params` (the KV-shaping parameters)."""
    stat = model_path.stat()
    parts = [f"format={FORMAT_VERSION}", f"path={model_path.resolve()}", f"size={stat.st_size}"]
    parts.append(f"mtime={stat.st_mtime_ns}")
    parts += [f"{name}={params[name]!r}" for name in sorted(params)]
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=32).digest()


class CorruptState(ValueError):
    """A saved state that must not be loaded."""


State = bytes | bytearray | memoryview


@dataclass(frozen=True)
class WindowCheckpoint:
    """A sliding-window checkpoint as saved: the positions its cells hold and its bytes (llama.cpp's
    partial sequence state). Read back, `data` is a view into the loaded file."""

    pos_min: int
    pos_max: int
    data: State
    stable: bool = False  # taken where a request's stable prefix (system prompt, tools) ends


@dataclass(frozen=True)
class Saved:
    path: Path
    tokens: tuple[int, ...]
    checkpoints: tuple[int, ...] = ()  # the last position of each saved window checkpoint


@dataclass
class Loaded:
    """A saved file mapped and checked: its sequence state (a view into the mapping, to be `close`d
    once llama.cpp has copied it) and the window checkpoints asked for (each in its own buffer)."""

    state: memoryview
    checkpoints: list[WindowCheckpoint]
    mapping: mmap.mmap

    def close(self) -> None:
        self.state.release()
        with contextlib.suppress(BufferError):  # a view still held elsewhere: the collector closes it
            self.mapping.close()


def _map(fh: BinaryIO) -> mmap.mmap:
    """The whole file, copy-on-write (ctypes wants a writable buffer; llama.cpp only reads it, so the
    page cache's own pages serve). A fresh buffer to read into cost a model process that had not
    restored before 22 ms for a 31 MiB file (its page faults), the mapping 11 ms; asking the kernel to
    populate the mapping at once copied every page and cost 24-29 ms."""
    if sys.platform.startswith("linux"):
        return mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)


def _pack(key: bytes, tokens: Sequence[int], state: State, checkpoints: Sequence[WindowCheckpoint]) -> list[State]:
    """The file's parts before the state's checksum (which `_write` adds as it writes them, and then
    the checkpoints' bytes)."""
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, key, len(tokens), len(state), len(checkpoints))
    table = b"".join(
        _CHECKPOINT.pack(c.pos_min, c.pos_max, len(c.data), zlib.crc32(c.data), STABLE if c.stable else 0)
        for c in checkpoints
    )
    return [head, struct.pack(f"<{len(tokens)}i", *tokens), table, state]


def _slices(parts: Sequence[State]) -> Iterator[memoryview]:
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, len(view), SLICE):
            yield view[start : start + SLICE]


@dataclass(frozen=True)
class _Layout:
    """Where a file's parts are, from its header, token list and checkpoint table."""

    tokens: tuple[int, ...]
    state_at: int
    state_size: int
    checkpoints: tuple[tuple[int, int, int, int, int], ...]  # (first and last position, bytes, CRC-32, flags)

    @property
    def state_end(self) -> int:
        return self.state_at + self.state_size


def _read_layout(fh: BinaryIO, key: bytes, size: int) -> _Layout:
    raw = fh.read(_HEAD.size)
    if len(raw) < _HEAD.size:
        raise CorruptState("truncated header")
    magic, version, file_key, n_tokens, n_state, n_checkpoints = _HEAD.unpack(raw)
    if magic != MAGIC:
        raise CorruptState("not a saved state")
    if version != FORMAT_VERSION:
        raise CorruptState(f"format version {version}")
    if file_key != key:
        raise CorruptState("saved for another model file or other settings")
    state_at = _HEAD.size + 4 * n_tokens + _CHECKPOINT.size * n_checkpoints
    if size < state_at + n_state + _SUM:
        raise CorruptState("truncated or padded")
    tokens = struct.unpack(f"<{n_tokens}i", fh.read(4 * n_tokens))
    table = tuple(_CHECKPOINT.iter_unpack(fh.read(_CHECKPOINT.size * n_checkpoints)))
    if size != state_at + n_state + _SUM + sum(c[2] for c in table):
        raise CorruptState("truncated or padded")
    return _Layout(tokens, state_at, n_state, table)


class PromptCache:
    """One model's saved sequence states: the index of what is on disk, restores and the writer."""

    def __init__(self, root: Path, model_path: Path, key: bytes, budget_bytes: int) -> None:
        self.root = root
        self.folder = model_folder(root, model_path)
        self.key = key
        self.budget = budget_bytes
        self._lock = threading.Lock()
        self._entries: dict[Path, Saved] = {}
        self._queue: queue.Queue[tuple[tuple[int, ...], State, tuple[WindowCheckpoint, ...]] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self.quiet = threading.Event()  # set while no request runs: the writer may write
        self.quiet.set()
        self.saves = self.restores = self.refused = 0
        self._scan()

    # -- the index ------------------------------------------------------------------------------
    def _scan(self) -> None:
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            try:
                with path.open("rb") as fh:
                    layout = _read_layout(fh, self.key, os.fstat(fh.fileno()).st_size)
            except (CorruptState, struct.error) as exc:
                self._refuse(path, str(exc))
                continue
            except OSError as exc:
                log.warning("prompt cache: cannot read %s (%s)", path, exc)
                continue
            self._entries[path] = Saved(path, layout.tokens, tuple(c[1] for c in layout.checkpoints))
        for stale in self.folder.glob(f"*{SUFFIX}.tmp"):  # a write cut short
            stale.unlink(missing_ok=True)

    def _refuse(self, path: Path, why: str) -> None:
        log.warning("prompt cache: removed %s: %s", path.name, why)
        self.refused += 1
        with self._lock:
            self._entries.pop(path, None)
        path.unlink(missing_ok=True)

    @property
    def entries(self) -> list[Saved]:
        with self._lock:
            return list(self._entries.values())

    def best(
        self, prompt: Sequence[int], usable: Callable[[Saved, int], int] = lambda _saved, n: n
    ) -> tuple[Saved | None, int]:
        """The saved state that lets the most of `prompt` go unevaluated, and how much: `usable(saved,
        shared)` says how much of the `shared` prefix a state can serve (the whole, by default)."""
        best: Saved | None = None
        length = 0
        for saved in self.entries:
            n = usable(saved, common_prefix(saved.tokens, prompt))
            if n > length:
                best, length = saved, n
        return best, length

    def holds(self, tokens: Sequence[int]) -> bool:
        """True when `tokens` are already saved (exactly, or as the start of a longer state)."""
        n = len(tokens)
        return any(len(s.tokens) >= n and common_prefix(s.tokens, tokens) == n for s in self.entries)

    # -- restore --------------------------------------------------------------------------------
    def load(self, saved: Saved, *, windows: int = 0) -> Loaded | None:
        """The file of `saved`, checked: its state and its newest `windows` window checkpoints (and its
        stable ones, whatever `windows` says, when it asks for any); None (and the file removed) when it
        fails a check."""
        try:
            with saved.path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                layout = _read_layout(fh, self.key, size)
                mapping = _map(fh)
        except CorruptState as exc:
            self._refuse(saved.path, str(exc))
            return None
        except OSError as exc:
            log.warning("prompt cache: cannot read %s (%s)", saved.path, exc)
            with self._lock:
                self._entries.pop(saved.path, None)
            return None
        view = memoryview(mapping)
        end = layout.state_end
        complete = len(view) == size and zlib.crc32(view[:end]) == _CRC.unpack_from(view, end)[0]
        checkpoints = []
        at = end + _SUM
        for i, (pos_min, pos_max, n, crc, flags) in enumerate(layout.checkpoints):
            stable = bool(flags & STABLE)
            if complete and windows > 0 and (i >= len(layout.checkpoints) - windows or stable):
                complete = zlib.crc32(view[at : at + n]) == crc
                checkpoints.append(WindowCheckpoint(pos_min, pos_max, bytearray(view[at : at + n]), stable))
            at += n
        loaded = Loaded(view[layout.state_at : end], checkpoints, mapping)
        view.release()
        why = "checksum mismatch" if not complete else None
        if why is None and layout.tokens != saved.tokens:
            why = "its tokens changed since it was indexed"
        if why is not None:
            loaded.close()
            self._refuse(saved.path, why)
            return None
        now = time.time()
        os.utime(saved.path, (now, now))  # least recently used goes first
        self.restores += 1
        return loaded

    def refuse(self, saved: Saved, why: str) -> None:
        """Remove a state llama.cpp would not take back."""
        self._refuse(saved.path, why)

    # -- save -----------------------------------------------------------------------------------
    def save(self, tokens: Sequence[int], state: State, checkpoints: Sequence[WindowCheckpoint] = ()) -> None:
        """Write a sequence's state (and its window checkpoints) in the background; a state already
        saved is not written again."""
        if self.budget <= 0 or len(tokens) < MIN_TOKENS or self.holds(tokens):
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="lmsp-prompt-cache", daemon=True)
            self._writer.start()
        self._queue.put((tuple(tokens), state, tuple(checkpoints)))

    def close(self, timeout: float | None = None) -> None:
        """Finish the writes queued so far (the model is done: no request will run)."""
        self.quiet.set()
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout)
            self._writer = None

    def _write_loop(self) -> None:
        lower_thread(WRITER_NICE)
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._write(*item)
            except Exception:
                log.exception("prompt cache: could not save a state")

    def _write(self, tokens: tuple[int, ...], state: State, checkpoints: tuple[WindowCheckpoint, ...]) -> None:
        name = hashlib.blake2b(struct.pack(f"<{len(tokens)}i", *tokens), digest_size=16).hexdigest()
        path = self.folder / f"{name}{SUFFIX}"
        parts = _pack(self.key, tokens, state, checkpoints)
        if sum(map(len, parts)) + _SUM + sum(len(c.data) for c in checkpoints) > self.budget:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as fh:
            crc = 0
            for piece in _slices(parts):
                self.quiet.wait()  # a request runs: its decode goes first
                crc = zlib.crc32(piece, crc)
                fh.write(piece)
            fh.write(_CRC.pack(crc))
            for piece in _slices([c.data for c in checkpoints]):
                self.quiet.wait()
                fh.write(piece)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        with self._lock:
            superseded = [
                s for s in self._entries.values() if len(s.tokens) < len(tokens) and _starts(tokens, s.tokens)
            ]
            for old in superseded:
                self._entries.pop(old.path, None)
            self._entries[path] = Saved(path, tokens, tuple(c.pos_max for c in checkpoints))
        for old in superseded:  # a longer state of the same conversation holds all it held
            old.path.unlink(missing_ok=True)
        self.saves += 1
        self._enforce_budget()

    def _enforce_budget(self) -> None:
        """Remove the least recently used files (of every model) until the folder fits the budget."""
        files = []
        for path in self.root.rglob(f"*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget:
                break
            path.unlink(missing_ok=True)
            with self._lock:
                self._entries.pop(path, None)
            total -= size
            log.info("prompt cache: evicted %s (least recently used)", path.name)

    @property
    def size_bytes(self) -> int:
        return folder_bytes(self.folder)


def _starts(tokens: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(prefix) <= len(tokens) and tuple(tokens[: len(prefix)]) == tuple(prefix)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from the start (the scheduler's and the cache's measure)."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(a[:mid]) == tuple(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo
