"""Tray icons: four distinct states, crisp at every tray size, and the committed PNGs up to date."""

from __future__ import annotations

import pytest
from PIL import Image

from lmsp_tray.desktop.icons import COLOURS, TRAY_SIZES, assets_dir, draw_icon, icon_filename, load_icon, tray_icons
from lmsp_tray.desktop.menu import ACTIVITIES


def pixels(image: Image.Image) -> list[tuple[int, int, int, int]]:
    raw = image.tobytes()
    return [tuple(raw[i : i + 4]) for i in range(0, len(raw), 4)]


@pytest.mark.parametrize("size", TRAY_SIZES)
def test_states_differ_at_every_size(size):
    images = [draw_icon(a, size) for a in ACTIVITIES]
    for image in images:
        assert image.size == (size, size) and image.mode == "RGBA"
    for i in range(len(images)):
        for j in range(i + 1, len(images)):
            assert images[i].tobytes() != images[j].tobytes()
    # Shape differs too, not only colour: compare the white glyph masks.
    masks = [bytes(1 if p == (255, 255, 255, 255) else 0 for p in pixels(im)) for im in images]
    assert len(set(masks)) == len(ACTIVITIES)


@pytest.mark.parametrize("activity", ACTIVITIES)
@pytest.mark.parametrize("size", TRAY_SIZES)
def test_glyph_is_crisp_and_tile_has_state_colour(activity, size):
    image = draw_icon(activity, size)
    data = pixels(image)
    white = sum(1 for p in data if p == (255, 255, 255, 255))
    assert white >= 12  # a visible glyph (three 2x2 dots at 16 px is the least)
    fill = COLOURS[activity][0]
    assert sum(1 for p in data if p[:3] == fill) > size * size // 3  # the tile shows the state colour
    if size < 48:
        # Glyph edges sit on whole pixels: no pixel is a blend of the tile colour and white.
        blends = [
            p
            for p in data
            if p[3] == 255 and p[:3] != fill and p[:3] != (255, 255, 255) and all(c >= f for c, f in zip(p[:3], fill))
        ]
        assert not blends
    assert image.getpixel((size // 2, 3))[3] == 255
    assert image.getpixel((0, 0))[3] < 128  # rounded corner is see-through


def test_committed_pngs_match_the_drawing():
    folder = assets_dir()
    assert folder is not None, "assets/ with the generated icons is missing; run assets/make_icons.py"
    for activity in ACTIVITIES:
        for size in TRAY_SIZES:
            with Image.open(folder / icon_filename(activity, size)) as committed:
                same = committed.convert("RGBA").tobytes() == draw_icon(activity, size).tobytes()
                assert same, f"{activity}-{size}: run assets/make_icons.py again"


def test_load_icon_falls_back_to_drawing(tmp_path):
    drawn = load_icon("serving", 22, folder=tmp_path)  # empty folder: nothing to load
    assert drawn.tobytes() == draw_icon("serving", 22).tobytes()
    assert drawn.tobytes() != draw_icon("idle", 22).tobytes()
    assert set(tray_icons(32, folder=tmp_path)) == set(ACTIVITIES)


def test_unknown_activity_is_an_error():
    with pytest.raises(ValueError):
        draw_icon("sleeping", 16)
