"""The service's checks of audio bytes before the model process decodes them (`serving.audio`), and the
wire that carries a checked clip to the model process beside images."""

from __future__ import annotations

import pytest
from gguf_factory import tone_wav

from lmsp_tray.engine import wire
from lmsp_tray.engine.jobs import AudioClip, ImagePixels
from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import IMAGE_MARKER, AudioInput, ImageInput, audio_from_base64, join_parts
from lmsp_tray.serving.audio import check, kind
from lmsp_tray.serving.images import decode_all

PART = "messages[0].content[1]"


def test_a_wav_passes_with_its_part() -> None:
    clip = check(AudioInput(tone_wav(0.5, channels=2), PART, "wav"))
    assert clip == AudioClip(tone_wav(0.5, channels=2), PART)


def test_kinds_by_their_first_bytes() -> None:
    assert kind(tone_wav(0.1)) == "wav"
    assert kind(b"fLaC\0\0\0\x22") == "flac"
    assert kind(b"ID3\x04\0\0") == kind(b"\xff\xfb\x90\x00") == "mp3"
    assert kind(b"RIFF\0\0\0\0WEBPVP8 ") is None  # a WebP image is RIFF too


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (tone_wav(1.0)[:3000], "cut short"),
        (tone_wav(1.0)[:30], "no format and data chunks"),
        (b"OggS" + b"\0" * 64, "not audio"),
        (b"fLaC" + b"\0" * 8, "STREAMINFO"),
    ],
)
def test_bad_bytes_are_refused_naming_the_part(data: bytes, says: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check(AudioInput(data, PART))
    assert says in info.value.detail and info.value.param == PART


def test_an_unknown_format_and_bad_base64_are_refused() -> None:
    with pytest.raises(InvalidRequest) as fmt:
        audio_from_base64("UklGRg==", "ogg", PART)
    assert fmt.value.param == PART + ".format"
    with pytest.raises(InvalidRequest) as b64:
        audio_from_base64("@@", "wav", PART)
    assert "base64" in b64.value.detail


def test_parts_render_with_the_marker_where_the_audio_is() -> None:
    clip = AudioInput(b"RIFF", PART)
    text, media = join_parts(["listen", clip, "then answer"])
    assert text == f"listen{IMAGE_MARKER}then answer" and media == (clip,)


def test_media_keep_their_order_through_checks_and_the_wire() -> None:
    png = ImageInput(bytes.fromhex("89504e470d0a1a0a"), "messages[0].content[0]")
    with pytest.raises(InvalidRequest):  # the image is decoded (and refused), the audio only checked
        decode_all([png, AudioInput(tone_wav(0.1), PART)])
    media = [ImagePixels(1, 1, b"\1\2\3"), AudioClip(tone_wav(0.1), PART), ImagePixels(1, 2, b"\4" * 6)]
    spec, prompt, back = wire.unpack_job(wire.pack_job({"max_tokens": 5}, [5, -1, 6, -1, -1], media))
    assert (spec, prompt, back) == ({"max_tokens": 5}, [5, -1, 6, -1, -1], media)
