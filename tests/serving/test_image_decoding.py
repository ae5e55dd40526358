"""Images are decoded in the service with Pillow as llama.cpp's decoder would read them: first frame,
EXIF orientation applied, alpha dropped; anything else is a 400 naming the part."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import IMAGE_MARKER, ImageInput, from_base64, from_url, join_parts
from lmsp_tray.serving.images import decode


def encoded(image: Image.Image, fmt: str, **save: object) -> ImageInput:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return ImageInput(out.getvalue(), "messages[0].content[1]")


def test_the_first_frame_of_an_animation() -> None:
    frames = [Image.new("RGB", (4, 3), color) for color in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    gif = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    pixels = decode(gif)
    assert (pixels.width, pixels.height) == (4, 3)
    assert pixels.rgb[:3] == bytes((255, 0, 0))


def test_exif_orientation_is_applied() -> None:
    image = Image.new("RGB", (6, 2), (10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to view
    pixels = decode(encoded(image, "PNG", exif=exif))
    assert (pixels.width, pixels.height) == (2, 6)


def test_alpha_is_dropped_as_llama_cpp_does() -> None:
    pixels = decode(encoded(Image.new("RGBA", (2, 2), (1, 2, 3, 0)), "PNG"))
    assert pixels.rgb == bytes((1, 2, 3)) * 4


@pytest.mark.parametrize(
    ("data", "says"),
    [(b"GIF89a", "not an image"), (b"plain text", "not an image"), (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "image")],
)
def test_bad_data_is_a_400_naming_the_part(data: bytes, says: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(ImageInput(data, "messages[0].content[1]"))
    assert info.value.param == "messages[0].content[1]" and says in info.value.detail


def test_urls_other_than_data_are_refused() -> None:
    for url in ("http://example.com/a.png", "https://example.com/a.png", "file:///etc/passwd", "a.png"):
        with pytest.raises(InvalidRequest) as info:
            from_url(url, "p")
        assert "not fetched" in info.value.detail
    assert from_url("data:image/png;base64,aGk=", "p").data == b"hi"
    assert from_base64(" aG\nk= ", "p").data == b"hi"


def test_parts_render_as_llama_server_renders_them() -> None:
    image = ImageInput(b"x", "p")
    assert join_parts(["a", "b", image, "c", image]) == (f"a\nb{IMAGE_MARKER}c{IMAGE_MARKER}", (image, image))
    assert join_parts([image, "describe"]) == (f"{IMAGE_MARKER}describe", (image,))
