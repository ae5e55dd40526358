"""The bytes between the service and a model process: small binary frames over a pipe.

A frame is a 9-byte header — payload length (u32), kind (u8), id (u32: the
job or call it belongs to) — and the payload. Text deltas travel as raw
UTF-8 and token lists as packed int32, so the streaming path never pickles
anything and a decode step's deltas for every sequence go out in one write
(`FrameWriter` gathers them until the step ends). Jobs, finishes and replies
are small JSON objects. `FrameReader` takes whatever one read returns and
yields every complete frame in it.

Nothing here knows about llama.cpp or the service; both sides import it.
"""

from __future__ import annotations

import array
import dataclasses
import json
import os
import struct
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from lmsp_tray.engine.jobs import AudioClip, Finish, FinishReason, ImagePixels, TokenLogprob
from lmsp_tray.engine.sampling import SamplingParams
from lmsp_tray.errors import LMSPError, error_from_problem

HEADER = struct.Struct("<IBI")
MAX_FRAME = 1 << 30  # a length beyond this means the stream is corrupt

# service -> model process
LOAD = 1  # JSON: what to load and how
SUBMIT = 2  # u32 JSON length, JSON job, int32 prompt tokens
CANCEL = 3  # stop job `id` (a generation, or an EMBED request)
TOKENIZE = 4  # u32 at_most (0: no limit), UTF-8 text -> TOKENS or ERROR
CALL = 5  # JSON {"op": ...} -> REPLY or ERROR
CLOSE = 6  # b"1": let running work finish first
MEASURE = 7  # pack_job({}, prompt tokens, media) -> TOKENS [the prompt's length with its media's tokens] or ERROR
EMBED = 16  # JSON {"inputs": [text or token list, ...]} or {"pairs": [[query, document], ...]} -> EMBEDDINGS or ERROR

# model process -> service
READY = 101  # JSON: the loaded model's facts
FAILED = 102  # JSON problem: the load failed (the process then exits)
TEXT = 103  # UTF-8 delta of job `id`
GRAMMAR_ON = 104  # UTF-8 rule name: job `id`'s lazy grammar switched on
FINISH = 105  # JSON: job `id` ended
REPLY = 106  # JSON answer to CALL `id`
TOKENS = 107  # int32 tokens answering TOKENIZE `id`
ERROR = 108  # JSON problem answering TOKENIZE/CALL/EMBED `id`
LOGPROB = 109  # JSON: the log probability of job `id`'s next token (before its TEXT)
LOADING = 111  # f32: the share of the model read so far (before READY)
LOAD_PROGRESS = struct.Struct("<f")
EMBEDDINGS = 116  # embedding.pack(): the vectors answering EMBED `id`

_INT32 = "i"
assert array.array(_INT32).itemsize == 4


def frame(kind: int, ident: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind, ident) + payload


def pack_json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8", errors="surrogatepass")


def unpack_json(payload: bytes | memoryview) -> Any:
    return json.loads(bytes(payload).decode("utf-8", errors="surrogatepass"))


def pack_tokens(tokens: Any) -> bytes:
    packed = array.array(_INT32, tokens)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_tokens(payload: bytes | memoryview) -> list[int]:
    packed = array.array(_INT32)
    packed.frombytes(bytes(payload))
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


# -- jobs and their ends ---------------------------------------------------------------------------


def pack_job(spec: dict[str, Any], prompt: Any, images: Sequence[ImagePixels | AudioClip] = ()) -> bytes:
    """A job's JSON, its prompt tokens, then the pixels of its images and the bytes of its audio clips (in
    the JSON: an image's size, an audio clip's length as ["audio", bytes, its part])."""
    if images:
        sizes = [[i.width, i.height] if isinstance(i, ImagePixels) else ["audio", len(i.data), i.param] for i in images]
        spec = {**spec, "prompt_tokens": len(prompt), "images": sizes}
    head = pack_json(spec)
    media = (i.rgb if isinstance(i, ImagePixels) else i.data for i in images)
    return b"".join((struct.pack("<I", len(head)), head, pack_tokens(prompt), *media))


def unpack_job(payload: bytes | memoryview) -> tuple[dict[str, Any], list[int], list[ImagePixels | AudioClip]]:
    (size,) = struct.unpack_from("<I", payload)
    spec = unpack_json(payload[4 : 4 + size])
    sizes = spec.pop("images", None) or []
    if not sizes:
        return spec, unpack_tokens(payload[4 + size :]), []
    at = 4 + size + 4 * int(spec.pop("prompt_tokens"))
    prompt = unpack_tokens(payload[4 + size : at])
    images: list[ImagePixels | AudioClip] = []
    for first, second, *param in sizes:
        if first == "audio":
            n = int(second)
            images.append(AudioClip(bytes(payload[at : at + n]), *param))
        else:
            n = int(first) * int(second) * 3
            images.append(ImagePixels(int(first), int(second), bytes(payload[at : at + n])))
        at += n
    return spec, prompt, images


def sampling_to_json(params: SamplingParams) -> dict[str, Any]:
    return dataclasses.asdict(params)


def sampling_from_json(data: dict[str, Any]) -> SamplingParams:
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    values = {k: v for k, v in data.items() if k in fields}
    if "grammar_triggers" in values:
        values["grammar_triggers"] = tuple(values["grammar_triggers"])
    return SamplingParams(**values)


def pack_error(error: LMSPError) -> dict[str, Any]:
    return {"problem": error.to_problem(), "headers": error.headers}


def unpack_error(data: dict[str, Any]) -> LMSPError:
    return error_from_problem(data.get("problem") or {}, headers=data.get("headers") or None)


def pack_finish(finish: Finish) -> bytes:
    data: dict[str, Any] = {
        "reason": finish.reason,
        "prompt_tokens": finish.prompt_tokens,
        "output_tokens": finish.output_tokens,
        "cached_tokens": finish.cached_tokens,
    }
    if finish.error is not None:
        data["error"] = pack_error(finish.error)
    if finish.stop_sequence is not None:
        data["stop_sequence"] = finish.stop_sequence
    return pack_json(data)


def unpack_finish(payload: bytes | memoryview) -> Finish:
    data = unpack_json(payload)
    error = unpack_error(data["error"]) if data.get("error") else None
    return Finish(
        FinishReason(data["reason"]),
        data["prompt_tokens"],
        data["output_tokens"],
        data["cached_tokens"],
        error,
        data.get("stop_sequence"),
    )


# -- reading and writing ---------------------------------------------------------------------------


class FrameReader:
    """Frames from a file descriptor; `frames()` ends at end of file."""

    def __init__(self, fd: int, chunk: int = 1 << 16) -> None:
        self._fd = fd
        self._chunk = chunk
        self._buf = bytearray()

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        """(kind, id, payload) for each frame, in order."""
        buf = self._buf
        while True:
            data = os.read(self._fd, max(self._chunk, self._needed()))
            if not data:
                return
            buf += data
            start = 0
            while len(buf) - start >= HEADER.size:
                size, kind, ident = HEADER.unpack_from(buf, start)
                if size > MAX_FRAME:
                    raise ValueError(f"corrupt frame header (length {size})")
                end = start + HEADER.size + size
                if end > len(buf):
                    break
                yield kind, ident, bytes(buf[start + HEADER.size : end])
                start = end
            del buf[:start]

    def _needed(self) -> int:
        if len(self._buf) < HEADER.size:
            return 0
        size = HEADER.unpack_from(self._buf, 0)[0]
        return HEADER.size + size - len(self._buf)


class FrameWriter:
    """Writes frames to a file descriptor from any thread; `queue` + `flush` batch them."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self.broken = False  # the reader went away

    def queue(self, data: bytes) -> None:
        with self._lock:
            self._pending.append(data)

    def send(self, data: bytes) -> None:
        with self._lock:
            self._pending.append(data)
            self._write_locked()

    def flush(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        if not self._pending:
            return
        data = memoryview(b"".join(self._pending))
        self._pending.clear()
        if self.broken:
            return
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:  # the other side is gone; its end is noticed by whoever reads from it
            self.broken = True


def pack_logprob(item: TokenLogprob) -> bytes:
    return pack_json([item.piece.hex(), item.logprob, [[piece.hex(), lp] for piece, lp in item.top]])


def unpack_logprob(payload: bytes | memoryview) -> TokenLogprob:
    piece, logprob, top = unpack_json(payload)
    return TokenLogprob(bytes.fromhex(piece), float(logprob), tuple((bytes.fromhex(p), float(lp)) for p, lp in top))
