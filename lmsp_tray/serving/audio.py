"""Checking a request's audio before it goes to the model process, which decodes it.

Why here and not a decoder: llama.cpp's multimodal library decodes WAV, MP3 and FLAC itself
(miniaudio, resampled to the encoder's rate), in the model process, so the same bytes give the same
samples as `llama-server --mmproj`. What must not reach it is what would make it allocate without
bound or read garbage: a file that is not audio (the helper would try it as an image), one cut short,
one whose header claims hours of samples. So the service reads the container's header with the
standard library (WAV's RIFF chunks, FLAC's STREAMINFO; an MP3's length estimated from its size and
its first frame's bit rate), refuses a bad file with a 400 naming its part, and hands the bytes on.
"""

from __future__ import annotations

import struct

from lmsp_tray.engine.jobs import AudioClip
from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import MAX_AUDIO_BYTES, AudioInput

MAX_AUDIO_SECONDS = 30 * 60  # half an hour: 60 windows of the encoder's 30 s


def kind(data: bytes) -> str | None:
    """ "wav", "mp3" or "flac" from the file's first bytes (libmtmd's own test), else None."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:3] == b"ID3" or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def _wav_seconds(data: bytes, param: str) -> float:
    """The length of a WAV file from its `fmt ` and `data` chunks; a 400 when they are missing or cut."""
    at, rate, frame = 12, 0, 0
    while at + 8 <= len(data):
        name, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        body = at + 8
        if name == b"fmt ":
            if size < 16 or body + 16 > len(data):
                break
            _, channels, rate, _, frame = struct.unpack_from("<HHIIH", data, body)
            if not channels or not rate or not frame:
                raise InvalidRequest("The WAV file's format chunk is not valid.", param=param)
        elif name == b"data":
            if not rate:
                break
            if body + size > len(data) and size != 0xFFFFFFFF:  # streaming writers leave the size unset
                raise InvalidRequest(
                    f"The WAV file is cut short: its data chunk claims {size:,} bytes, {len(data) - body:,} follow.",
                    param=param,
                )
            return min(size, len(data) - body) / frame / rate
        at = body + size + (size & 1)
    raise InvalidRequest("The WAV file has no format and data chunks (it is cut short or not valid).", param=param)


def _flac_seconds(data: bytes, param: str) -> float:
    """The length a FLAC file's STREAMINFO block declares; a 400 when it is missing."""
    if len(data) < 8 + 34 or data[4] & 0x7F != 0:
        raise InvalidRequest("The FLAC file has no STREAMINFO block (it is cut short or not valid).", param=param)
    packed = int.from_bytes(data[8 + 10 : 8 + 18], "big")  # 20 bits rate, 3 channels, 5 depth, 36 samples
    rate, samples = packed >> 44, packed & ((1 << 36) - 1)
    if not rate:
        raise InvalidRequest("The FLAC file's STREAMINFO block is not valid.", param=param)
    return samples / rate


# MPEG audio bit rates in kbit/s by bit-rate index: MPEG-1 Layer III, and MPEG-2/2.5 Layer III
MP3_KBPS = {
    3: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 0),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 0),
}


def _mp3_seconds(data: bytes, param: str) -> float:
    """An MP3's length from its size and its first frame's bit rate (exact for constant bit rate); a 400
    when no frame header is found where it should be."""
    at = 0
    if data[:3] == b"ID3" and len(data) >= 10:  # an ID3v2 tag first: its size is 4 x 7 bits
        at = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(data[6:10]))
    head = data[at : at + 4]
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        raise InvalidRequest(
            "The MP3 file has no frame where its first should be (cut short or not valid).", param=param
        )
    version, layer, index = (head[1] >> 3) & 3, (head[1] >> 1) & 3, head[2] >> 4
    kbps = MP3_KBPS[3 if version == 3 else 2][index] if layer == 1 else 0  # layer bits 01: Layer III
    if not kbps:
        raise InvalidRequest("The MP3 file's first frame is not an MPEG Layer III frame.", param=param)
    return (len(data) - at) * 8 / (kbps * 1000)


def check(audio: AudioInput) -> AudioClip:
    """`audio` as the model process takes it, once its bytes are audio of a length this service takes; a
    400 naming its part otherwise."""
    if len(audio.data) > MAX_AUDIO_BYTES:
        raise InvalidRequest(f"The audio is larger than {MAX_AUDIO_BYTES >> 20} MiB.", param=audio.param)
    found = kind(audio.data)
    if found is None:
        raise InvalidRequest("The data is not audio this service reads (WAV, MP3 or FLAC).", param=audio.param)
    if found == "wav":
        seconds = _wav_seconds(audio.data, audio.param)
    elif found == "flac":
        seconds = _flac_seconds(audio.data, audio.param)
    else:
        seconds = _mp3_seconds(audio.data, audio.param)
    if seconds <= 0:
        raise InvalidRequest("The audio holds no samples.", param=audio.param)
    if seconds > MAX_AUDIO_SECONDS:
        raise InvalidRequest(
            f"The audio is {seconds / 60:,.1f} minutes long; at most {MAX_AUDIO_SECONDS // 60} minutes are taken.",
            param=audio.param,
        )
    return AudioClip(audio.data, audio.param)
