"""The device probe: start llama.cpp's backend, print what it sees as JSON on stdout, exit.

Why a process of its own: the service must never load `libllama` (nor a GPU driver), but it plans
every load from the backend and devices llama.cpp sees. It runs this once at start-up as
`python -m lmsp_tray.runner.probe` (`engine.launch`) and reads `engine.devices.Devices` from its
output (`engine.devices.probe`). Nothing but that one JSON line goes to stdout: llama.cpp's own
output goes to stderr. It loads llama.cpp's libraries without importing the `llama_cpp` package
(`backends`), so that a start-up waits a tenth of a second for it, not half a second.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    out = os.dup(1)
    os.dup2(2, 1)  # C code writing to stdout (a backend's banner) lands on stderr
    sys.stdout = sys.stderr
    from lmsp_tray.runner import backends  # llama.cpp is loaded here

    answer = json.dumps(backends.probe().to_json())
    with os.fdopen(out, "w", encoding="utf-8") as fh:
        fh.write(answer + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
