"""The tray icons: one drawing per activity, made crisp at every tray size.

Each icon is a rounded tile in the state's colour with a white glyph:
idle (slate grey, an empty frame: no model in memory), ready (blue, lines
of text: a model is loaded), loading (amber, three dots), serving (green,
level bars), error (red, an exclamation mark). Colour and shape both
differ, so the states stay distinct for colour-blind users and on any
panel colour. The app icon is the "ready" drawing.

Geometry is computed per pixel size and snapped to whole pixels, then drawn
at 8x and reduced with an area filter: straight edges stay sharp, only the
rounded corners get smoothed. `assets/make_icons.py` writes these images
into `assets/`; the tray loads the PNGs from there when they are present
(a source checkout, a frozen build) and draws the same images in memory
otherwise (a wheel install carries no `assets/`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image, ImageDraw

from lmsp_tray.desktop.menu import ACTIVITIES, ERROR, IDLE, LOADING, READY, SERVING

TRAY_SIZES = (16, 22, 24, 32, 48, 64)
APP_SIZES = (16, 24, 32, 48, 64, 128, 256, 512, 1024)

# (tile fill, tile edge) per activity; the glyph is white on all four.
COLOURS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    IDLE: ((71, 85, 105), (39, 48, 61)),  # slate grey
    READY: ((37, 99, 235), (23, 62, 150)),  # blue
    LOADING: ((217, 119, 6), (146, 72, 4)),  # amber
    SERVING: ((22, 163, 74), (14, 102, 46)),  # green
    ERROR: ((220, 38, 38), (140, 22, 22)),  # red
}
GLYPH = (255, 255, 255, 255)
_SCALE = 8

Rect = tuple[int, int, int, int]  # left, top, right, bottom in whole pixels (right/bottom exclusive)


def _stroke(size: int) -> int:
    """Bar thickness: 2 px at 16, 3 at 22-24, 4 at 32, 6 at 48, 8 at 64."""
    return max(2, round(size / 8))


def _padding(size: int) -> int:
    """Space between the tile's edge and the glyph: 3 px at 16, 4 at 22, 7 at 32, 14 at 64."""
    return max(3, int(size * 0.22))


def _centre(size: int, extent: int) -> int:
    return (size - extent) // 2


def _glyph_rects(activity: str, size: int) -> list[Rect]:
    """The glyph as whole-pixel rectangles, centred on the tile."""
    t = _stroke(size)
    if activity == IDLE:  # an empty frame
        t = max(2, round(size / 10))
        side = size - 2 * _padding(size)
        x0 = y0 = _centre(size, side)
        x1 = y1 = x0 + side
        return [(x0, y0, x1, y0 + t), (x0, y1 - t, x1, y1), (x0, y0 + t, x0 + t, y1 - t), (x1 - t, y0 + t, x1, y1 - t)]
    if activity == READY:  # three lines of text, the last one short
        gap = max(1, round(t * 0.75))
        width = size - 2 * _padding(size)
        height = 3 * t + 2 * gap
        x0, y0 = _centre(size, width), _centre(size, height)
        short = max(t * 2, round(width * 0.6))
        return [
            (x0, y0, x0 + width, y0 + t),
            (x0, y0 + t + gap, x0 + width, y0 + 2 * t + gap),
            (x0, y0 + 2 * (t + gap), x0 + short, y0 + 3 * t + 2 * gap),
        ]
    if activity == LOADING:  # three dots
        dot = t if size < 32 else round(t * 1.25)
        gap = dot if size < 24 else round(dot * 0.75)
        width = 3 * dot + 2 * gap
        x0, y0 = _centre(size, width), _centre(size, dot)
        return [(x0 + i * (dot + gap), y0, x0 + i * (dot + gap) + dot, y0 + dot) for i in range(3)]
    if activity == SERVING:  # three level bars of different heights, on one baseline
        gap = max(1, round(t * 0.5))
        width = 3 * t + 2 * gap
        full = size - 2 * _padding(size)
        heights = (round(full * 0.55), full, round(full * 0.75))
        x0 = _centre(size, width)
        base = _centre(size, full) + full
        return [(x0 + i * (t + gap), base - h, x0 + i * (t + gap) + t, base) for i, h in enumerate(heights)]
    if activity == ERROR:  # an exclamation mark
        full = size - 2 * _padding(size)
        gap = max(1, round(t * 0.5))
        x0 = _centre(size, t)
        y0 = _centre(size, full)
        bottom = y0 + full
        return [(x0, y0, x0 + t, bottom - t - gap), (x0, bottom - t, x0 + t, bottom)]
    raise ValueError(f"unknown activity {activity!r}; expected one of {ACTIVITIES}")


def draw_icon(activity: str, size: int) -> Image.Image:
    """The RGBA icon for `activity` at `size` x `size` pixels."""
    if size < 16:
        raise ValueError("icons are drawn from 16 px up")
    fill, edge = COLOURS[activity] if activity in COLOURS else COLOURS[READY]
    glyph = _glyph_rects(activity, size)
    k = _SCALE
    big = Image.new("RGBA", (size * k, size * k), (0, 0, 0, 0))
    pen = ImageDraw.Draw(big)
    margin = 0 if size < 22 else max(1, round(size / 32))
    radius = max(3, round(size * 0.22))
    box = (margin * k, margin * k, (size - margin) * k - 1, (size - margin) * k - 1)
    border = 1 if size < 48 else round(size / 48)
    pen.rounded_rectangle(box, radius=radius * k, fill=edge)
    inner = tuple(v + sign * border * k for v, sign in zip(box, (1, 1, -1, -1)))
    pen.rounded_rectangle(inner, radius=max(1, radius - border) * k, fill=fill)
    round_caps = size >= 48 and activity != IDLE  # the frame is one shape: square joins
    for left, top, right, bottom in glyph:
        shape = (left * k, top * k, right * k - 1, bottom * k - 1)
        if round_caps:
            pen.rounded_rectangle(shape, radius=min(right - left, bottom - top) * k // 3, fill=GLYPH)
        else:
            pen.rectangle(shape, fill=GLYPH)
    return big.resize((size, size), Image.Resampling.BOX)


def icon_filename(activity: str, size: int) -> str:
    return f"lmsp-tray-{activity}-{size}.png"


def assets_dir() -> Path | None:
    """`assets/` of a source checkout or a PyInstaller bundle, if there is one."""
    candidates = []
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        candidates.append(Path(bundle) / "assets")
    candidates.append(Path(__file__).resolve().parents[2] / "assets")
    for folder in candidates:
        if (folder / icon_filename(IDLE, 16)).is_file():
            return folder
    return None


def load_icon(activity: str, size: int, folder: Path | None = None) -> Image.Image:
    """The icon from `assets/` when present (same pixels as `draw_icon`), else drawn now."""
    folder = folder if folder is not None else assets_dir()
    if folder is not None:
        path = folder / icon_filename(activity, size)
        try:
            with Image.open(path) as image:
                return image.convert("RGBA")
        except OSError:
            pass
    return draw_icon(activity, size)


def tray_icons(size: int = 64, folder: Path | None = None) -> dict[str, Image.Image]:
    """One image per activity at the size handed to pystray (it scales to the panel)."""
    return {activity: load_icon(activity, size, folder) for activity in ACTIVITIES}
