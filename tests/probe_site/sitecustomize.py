"""Lets an Xvfb test watch the real `lmsp-tray` program's Gtk menu (see tests/gtk_probe.py).

Put this folder on PYTHONPATH (after the checkout) and set LMSP_TRAY_PROBE_DIR:
Python imports `sitecustomize` at start-up, and this wraps `TrayApp.run` so
that the menu widgets are dumped to `$LMSP_TRAY_PROBE_DIR/menu.json`. Nothing
else about the program changes; without the variable this does nothing.
"""

import os
import sys
from pathlib import Path

_PROBE_DIR = os.environ.get("LMSP_TRAY_PROBE_DIR")

if _PROBE_DIR:
    import lmsp_tray.desktop.tray as _tray

    _original_run = _tray.TrayApp.run

    def _run_with_probe(self):  # type: ignore[no-untyped-def]
        sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests/, for gtk_probe
        from gtk_probe import start_menu_dump

        start_menu_dump(self, Path(_PROBE_DIR))
        return _original_run(self)

    _tray.TrayApp.run = _run_with_probe
