"""A model's multimodal projector, loaded with llama.cpp's multimodal library (libmtmd).

Why a module: an image becomes part of a prompt's token sequence, so the scheduler keeps treating a
prompt as a list of token ids. `Vision.expand` puts each image's tokens where the service left an
`IMAGE_SLOT`: the text tokens libmtmd puts around an image (none for LLaVA's projector, e.g.
`<start_of_image>` for Gemma 3), then one id per image position, negative and the same for every
position of the image: derived from a hash of its pixels, so two sequences with the same image share
its prefix, a follow-up turn re-sending the conversation reuses the image's KV instead of encoding it
again, and the prompt cache on disk keys saved states by it. `evaluate` encodes an image and decodes
its embeddings into a sequence (libmtmd's helper: micro-batches of the context's batch size, the
attention mask the projector needs). Only models whose image positions are one per token (not
M-RoPE's 2-D positions) take images here; the others load text only.

Audio goes the same way where the projector has an audio encoder: the service checked the file (its
kind, size and length) and libmtmd's helper decodes it here (WAV, MP3, FLAC, resampled to the
encoder's rate); each 30 s window of it is one chunk of positions whose id comes from a hash of the
file's bytes and the window's index. A file libmtmd cannot decode is a 400 naming its part.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd

from lmsp_tray.engine.jobs import IMAGE_SLOT, AudioClip, ImagePixels
from lmsp_tray.errors import InvalidRequest, UnsupportedCapability

log = logging.getLogger("lmsp_tray.runner")

IMAGE_TOKEN_SPAN = (1 << 31) - 2  # image ids are -2 .. -(2^31 - 1); -1 is IMAGE_SLOT
NO_CALLBACK = mtmd.mtmd_helper_post_decode_callback()  # a NULL function pointer
MEDIA_MARKER = "<__media__>"  # libmtmd's default marker (llama-server renders images as it)


def image_token(image: ImagePixels) -> int:
    """The id every position of `image` has in a prompt: negative, from a hash of its size and pixels."""
    digest = hashlib.blake2b(image.rgb, digest_size=8, key=f"{image.width}x{image.height}".encode()).digest()
    return -2 - int.from_bytes(digest, "little") % IMAGE_TOKEN_SPAN


def audio_token(clip: AudioClip, window: int) -> int:
    """The id every position of window `window` (30 s) of `clip` has in a prompt, from a hash of its bytes."""
    digest = hashlib.blake2b(clip.data, digest_size=8, key=f"audio {window}".encode()).digest()
    return -2 - int.from_bytes(digest, "little") % IMAGE_TOKEN_SPAN


def is_image(token: int) -> bool:
    return token < IMAGE_SLOT


def text_run(tokens: Sequence[int]) -> int:
    """How many of `tokens` come before the first image position (all of them when there is none)."""
    for i, token in enumerate(tokens):
        if token < 0:
            return i
    return len(tokens)


def image_start(tokens: Sequence[int], keep: int) -> int:
    """`keep` moved back to the start of the image it falls inside (a sequence keeps whole images only)."""
    while 0 < keep < len(tokens) and is_image(tokens[keep]) and tokens[keep - 1] == tokens[keep]:
        keep -= 1
    return keep


@dataclass(eq=False)
class ImageChunk:
    """One image (or 30 s of audio), preprocessed by libmtmd for the projector: `n_tokens` positions; freed
    with the object."""

    chunk: Any
    n_tokens: int
    _free: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._free = weakref.finalize(self, mtmd.mtmd_input_chunk_free, self.chunk)


@dataclass(frozen=True)
class Expanded:
    """A prompt with its images' tokens in place, and the chunk that evaluates each image id."""

    prompt: list[int]
    images: dict[int, ImageChunk]


class Vision:
    """The projector of one loaded model (only the thread that owns the context evaluates)."""

    def __init__(self, path: Path, model: llama_cpp.llama_model_p, *, threads: int, gpu: bool) -> None:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = gpu
        params.n_threads = threads
        params.print_timings = False
        params.warmup = False
        ctx = mtmd.mtmd_init_from_file(str(path).encode(), model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp's multimodal library could not load the projector {path.name}")
        self.ctx: Any = ctx
        one_position = not mtmd.mtmd_decode_use_mrope(ctx)
        self.images = bool(mtmd.mtmd_support_vision(ctx)) and one_position  # takes images
        self.audio = bool(mtmd.mtmd_support_audio(ctx)) and one_position  # takes audio
        if not self.images and not self.audio:
            self.close()
            raise RuntimeError(f"{path.name} has no vision or audio encoder with one position per token")
        self.marker = (mtmd.mtmd_default_marker() or MEDIA_MARKER.encode()).decode()

    def close(self) -> None:
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None

    def expand(self, prompt: Sequence[int], images: Sequence[ImagePixels | AudioClip]) -> Expanded:
        """`prompt` with each IMAGE_SLOT replaced by the tokens of the next of `images` (images and audio)."""
        slots = sum(1 for t in prompt if t == IMAGE_SLOT)
        if slots != len(images):
            raise InvalidRequest(f"The prompt has {slots} image places for {len(images)} images.", param="input")
        if prompt and prompt[-1] == IMAGE_SLOT:
            raise InvalidRequest("A prompt cannot end with an image.", param="input")
        out: list[int] = []
        chunks: dict[int, ImageChunk] = {}
        pending = iter(images)
        for token in prompt:
            if token != IMAGE_SLOT:
                out.append(token)
                continue
            media = next(pending)
            if isinstance(media, AudioClip):
                pieces = self._tokenize(self._audio_bitmap(media), "audio", media.param)
                idents = [audio_token(media, window) for window in range(len(pieces))]
            else:
                pieces = self._tokenize(self._image_bitmap(media), "image", "input")
                idents = [image_token(media)]
            for ident, (before, chunk, after) in zip(idents, pieces, strict=True):
                chunks.setdefault(ident, chunk)
                out.extend(before)
                out.extend([ident] * chunk.n_tokens)
                out.extend(after)
        return Expanded(out, chunks)

    def _image_bitmap(self, image: ImagePixels) -> Any:
        if not self.images:
            raise UnsupportedCapability("The model's projector takes no images (capability 'vision').", param="input")
        if len(image.rgb) != image.width * image.height * 3 or not image.width or not image.height:
            raise InvalidRequest("An image's pixels do not match its size.", param="input")
        data = (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
        return mtmd.mtmd_bitmap_init(image.width, image.height, data)

    def _audio_bitmap(self, clip: AudioClip) -> Any:
        """`clip` decoded by libmtmd's helper (miniaudio: WAV, MP3, FLAC) to the encoder's sample rate."""
        if not self.audio:
            raise UnsupportedCapability("The model's projector takes no audio (capability 'audio').", param=clip.param)
        data = (ctypes.c_ubyte * len(clip.data)).from_buffer_copy(clip.data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, data, len(clip.data), False)
        if not bitmap:
            raise InvalidRequest("The audio could not be decoded (WAV, MP3 or FLAC are taken).", param=clip.param)
        if not mtmd.mtmd_bitmap_is_audio(bitmap):  # the helper read it as an image
            mtmd.mtmd_bitmap_free(bitmap)
            raise InvalidRequest("The data is not audio (WAV, MP3 or FLAC are taken).", param=clip.param)
        return bitmap

    def _tokenize(self, bitmap: Any, kind: str, param: str) -> list[tuple[list[int], ImageChunk, list[int]]]:
        """Each media chunk libmtmd makes of `bitmap` (one per image, one per 30 s of audio) with the text
        tokens it puts before and after that chunk; frees `bitmap`."""
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            marker = self.marker.encode()
            text = mtmd.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            if mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
                raise InvalidRequest(f"The model's projector could not take this {kind}.", param=param)
            pieces: list[tuple[list[int], ImageChunk, list[int]]] = []
            before: list[int] = []
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t(0)
                    ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    (pieces[-1][2] if pieces else before).extend(ptr[j] for j in range(n.value))
                else:
                    n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
                    pieces.append((before, ImageChunk(mtmd.mtmd_input_chunk_copy(chunk), n_tokens), []))
                    before = []
            if not pieces:
                raise InvalidRequest(f"The model's projector made nothing of this {kind}.", param=param)
            return pieces
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def evaluate(self, lctx: llama_cpp.llama_context_p, image: ImageChunk, pos: int, seq_id: int, batch: int) -> bool:
        """Encode `image` and decode its embeddings into sequence `seq_id` from position `pos`; True when
        llama.cpp did both."""
        if mtmd.mtmd_encode_chunk(self.ctx, image.chunk) != 0:
            return False
        embd = mtmd.mtmd_get_output_embd(self.ctx)
        new_pos = llama_cpp.llama_pos(0)
        done = mtmd.mtmd_helper_decode_image_chunk(
            self.ctx, lctx, image.chunk, embd, pos, seq_id, batch, ctypes.byref(new_pos), NO_CALLBACK, None
        )
        return done == 0
