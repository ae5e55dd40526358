"""Decoding a request's images into the RGB pixels the model process takes.

Why here, with Pillow: the model process must only ever see pixels it can take (a corrupt file
must not reach llama.cpp's decoder inside the process that holds the model), and the service
refuses a bad image with a 400 naming its part before any model is loaded. Pillow decodes PNG,
JPEG, WebP and GIF (the first frame of an animation) as llama.cpp's own decoder does (the same
pixels for PNG, WebP and GIF; JPEG decoders differ by a few levels); EXIF orientation is applied,
as a phone photo is meant to be seen. Size limits hold before any pixel is decoded: the header's
width and height (a decompression bomb: a small file that claims a huge image) and the file's
bytes (`protocol.images.MAX_IMAGE_BYTES`). Decoding is CPU work: callers run it off the event loop.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

from PIL import Image, ImageOps, UnidentifiedImageError

from lmsp_tray.engine.jobs import AudioClip, ImagePixels
from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import ImageInput, Media
from lmsp_tray.serving import audio

MAX_PIXELS = 4096 * 4096  # 16.8 megapixels (48 MiB of RGB to the model process)
MAX_SIDE = 16384
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def decode(image: ImageInput) -> ImagePixels:
    """`image`'s first frame as RGB pixels, upright; a 400 naming its part when it is not an image
    Pillow reads, is cut short, or is larger than `MAX_PIXELS`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(image.data), formats=FORMATS) as opened:
                width, height = opened.size
                if width * height > MAX_PIXELS or max(width, height) > MAX_SIDE:
                    raise InvalidRequest(
                        f"The image is {width}x{height} pixels; at most {MAX_PIXELS:,} pixels "
                        f"(e.g. 4096x4096) are taken. Send a smaller image.",
                        param=image.param,
                    )
                opened.seek(0)  # an animation: its first frame
                upright = ImageOps.exif_transpose(opened)
                rgb = upright.convert("RGB")
                rgb.load()
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequest(
            f"The image claims more pixels than this service takes (at most {MAX_PIXELS:,}). Send a smaller image.",
            param=image.param,
        ) from None
    except UnidentifiedImageError:
        raise InvalidRequest(
            "The data is not an image this service reads (PNG, JPEG, WebP, GIF or BMP).", param=image.param
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated or corrupt data
        raise InvalidRequest(f"The image could not be decoded: {exc}.", param=image.param) from None
    return ImagePixels(rgb.width, rgb.height, rgb.tobytes())


def decode_all(media: Sequence[Media]) -> list[ImagePixels | AudioClip]:
    """Each image decoded, each audio clip checked (`serving.audio`: the model process decodes it)."""
    return [decode(m) if isinstance(m, ImageInput) else audio.check(m) for m in media]
