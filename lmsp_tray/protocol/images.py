"""Images in requests, as every API spells them, before they are decoded: the bytes and where they were.

Why a module: OpenAI's chat (`image_url` parts), the Responses shape (`input_image`), Anthropic's
`image` blocks and Ollama's `images` arrays all carry an image as base64 bytes, some inside a
`data:` URL. They are checked here the same way: a remote `http(s)` URL is never fetched (a
loopback service must not become a way to make requests elsewhere) and neither is a `file:` URL;
the client is told to send the bytes. The service decodes the bytes (`serving.images`, with Pillow)
when it builds the job.

Audio (OpenAI chat's `input_audio` parts, a transcription's file) is carried the same way, as
`AudioInput`: base64 bytes with the format the client names; the service checks the bytes
(`serving.audio`) and the model process decodes them.

A message's text holds `IMAGE_MARKER` where each of its images (and audio clips) goes, as llama-server
renders content parts (`join_parts`): text parts joined by a newline, the marker where the media part
is, nothing added around it. The model process cuts the rendered prompt there.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

from lmsp_tray.errors import InvalidRequest

IMAGE_MARKER = "<__media__>"  # libmtmd's default media marker
MAX_IMAGE_BYTES = 20 << 20  # an encoded image larger than this is refused
MAX_IMAGES = 16  # per request
MAX_AUDIO_BYTES = 25 << 20  # an audio file larger than this is refused (OpenAI's limit for a transcription)
MAX_AUDIO_CLIPS = 8  # per request
AUDIO_FORMATS = ("wav", "mp3", "flac")


@dataclass(frozen=True)
class ImageInput:
    """One image of a request: its encoded bytes (PNG, JPEG, WebP, GIF...) and the part it came from."""

    data: bytes
    param: str  # e.g. "messages[0].content[1]", for the error that names it


@dataclass(frozen=True)
class AudioInput:
    """One audio file of a request (WAV, MP3 or FLAC bytes), the format the client named, and its part."""

    data: bytes
    param: str  # e.g. "messages[0].content[1]"
    format: str = ""  # "wav" | "mp3" | "flac" as sent ("" when not named); the bytes decide


Media = ImageInput | AudioInput


def _bytes(data: str, param: str, what: str, limit: int) -> bytes:
    """The bytes of base64 text `data` (whitespace allowed), at most `limit`; a 400 naming `param`."""
    if not isinstance(data, str) or not data:
        raise InvalidRequest(f"The {what} has no data: send it as base64.", param=param)
    if len(data) > limit * 4 // 3 + 4096:
        raise InvalidRequest(f"The {what} is larger than {limit >> 20} MiB.", param=param)
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"The {what} data is not valid base64.", param=param) from None
    if not raw:
        raise InvalidRequest(f"The {what} is empty.", param=param)
    return raw


def from_base64(data: str, param: str) -> ImageInput:
    """The image in base64 text `data` (whitespace allowed); a 400 naming `param` when it is not base64."""
    return ImageInput(_bytes(data, param, "image", MAX_IMAGE_BYTES), param)


def audio_from_base64(data: str, fmt: str | None, param: str) -> AudioInput:
    """The audio in base64 text `data`, in format `fmt` (OpenAI's `input_audio.format`); a 400 naming
    `param` when it is not base64, too large, or in a format this service does not read."""
    fmt = (fmt or "").lower()
    if fmt and fmt not in AUDIO_FORMATS:
        raise InvalidRequest(
            f"Audio in format '{fmt}' is not read: send {', '.join(AUDIO_FORMATS)}.", param=f"{param}.format"
        )
    return AudioInput(_bytes(data, param, "audio", MAX_AUDIO_BYTES), param, fmt)


def from_url(url: str, param: str) -> ImageInput:
    """The image in a `data:` URL (`data:image/png;base64,...`); any other URL is refused with a 400."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest("The image has no URL: send it as a data: URL with base64 bytes.", param=param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https", "file", "ftp") or scheme != "data":
        shown = scheme or "a URL without a scheme"
        raise InvalidRequest(
            f"Image URLs are not fetched ({shown}): this local service does not make requests elsewhere or read "
            f"files for a client. Send the image's bytes instead, as a data: URL "
            f"(data:image/png;base64,...).",
            param=param,
        )
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().endswith(";base64"):
        raise InvalidRequest("A data: URL for an image must be base64 (data:image/png;base64,...).", param=param)
    return from_base64(payload, param)


def join_parts(parts: Sequence[str | Media]) -> tuple[str, tuple[Media, ...]]:
    """A message's content parts as one text (llama-server's rule: text parts joined by a newline, the
    marker where an image or audio clip is, no newline before or after it) and its media, in order."""
    text = ""
    images: list[Media] = []
    after_image = False
    for part in parts:
        if not isinstance(part, str):
            text += IMAGE_MARKER
            images.append(part)
            after_image = True
            continue
        if text and not after_image:
            text += "\n"
        text += part
        after_image = False
    return text, tuple(images)


def check_images(media: Sequence[Media]) -> None:
    """At most `MAX_IMAGES` images and `MAX_AUDIO_CLIPS` audio clips in one request."""
    images = sum(1 for m in media if isinstance(m, ImageInput))
    if images > MAX_IMAGES:
        raise InvalidRequest(f"A request may hold at most {MAX_IMAGES} images; it holds {images}.")
    clips = len(media) - images
    if clips > MAX_AUDIO_CLIPS:
        raise InvalidRequest(f"A request may hold at most {MAX_AUDIO_CLIPS} audio clips; it holds {clips}.")
