"""Write the tray and app icons into this folder: `python assets/make_icons.py`.

The drawings live in `lmsp_tray/desktop/icons.py` (the tray can draw them itself
when `assets/` is not installed); this script renders them per size:

- `lmsp-tray-<state>-<size>.png` for the 5 states at 16, 22, 24, 32, 48, 64 px
  (the tray icons),
- `lmsp-tray.png` (256 px) and `lmsp-tray-<size>.png` (app icon for launchers),
- `lmsp-tray.ico` (Windows: 16-256 px) and `lmsp-tray.icns` (macOS: 16-1024 px),
- `preview.png`: every state at every tray size on a light and a dark panel.

Run it again after changing the drawing and commit the results.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from PIL import Image

from lmsp_tray.desktop.icons import APP_SIZES, TRAY_SIZES, draw_icon, icon_filename
from lmsp_tray.desktop.menu import ACTIVITIES, READY


def preview(icons: dict[tuple[str, int], Image.Image]) -> Image.Image:
    pad = 8
    width = pad + sum(s + pad for s in TRAY_SIZES)
    row = max(TRAY_SIZES) + pad
    sheet = Image.new("RGBA", (width * 2, pad + row * len(ACTIVITIES)), (0, 0, 0, 255))
    for half, panel in enumerate(((240, 240, 240, 255), (40, 40, 46, 255))):
        sheet.paste(panel, (half * width, 0, (half + 1) * width, sheet.height))
        for r, activity in enumerate(ACTIVITIES):
            x = half * width + pad
            for size in TRAY_SIZES:
                y = pad + r * row + (max(TRAY_SIZES) - size) // 2
                sheet.alpha_composite(icons[activity, size], (x, y))
                x += size + pad
    return sheet


def main() -> int:
    icons = {(a, s): draw_icon(a, s) for a in ACTIVITIES for s in TRAY_SIZES}
    for (activity, size), image in icons.items():
        image.save(HERE / icon_filename(activity, size), optimize=True)
    app = {s: draw_icon(READY, s) for s in APP_SIZES}  # the app icon: a model ready to answer
    for size in (48, 128):
        app[size].save(HERE / f"lmsp-tray-{size}.png", optimize=True)
    app[256].save(HERE / "lmsp-tray.png", optimize=True)
    # Pillow picks each size from the largest image given; hand it the exact renders.
    ico_sizes = [s for s in APP_SIZES if s <= 256]
    app[256].save(
        HERE / "lmsp-tray.ico", sizes=[(s, s) for s in ico_sizes], append_images=[app[s] for s in ico_sizes if s != 256]
    )
    try:
        app[1024].save(HERE / "lmsp-tray.icns", append_images=[app[s] for s in (16, 32, 64, 128, 256, 512)])
    except (OSError, ValueError, KeyError) as exc:  # older Pillow builds cannot write ICNS
        print(f"lmsp-tray.icns not written: {exc}", file=sys.stderr)
    preview(icons).save(HERE / "preview.png", optimize=True)
    print(f"wrote {len(icons)} tray icons and the app icons into {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
