"""`python -m lmsp_tray` runs the command-line entry point (or, with the internal worker flag, a
model process: `engine.worker`, which the service starts for each loaded model)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "--lmsp-model-worker":
    from lmsp_tray.engine.worker import main as worker_main

    raise SystemExit(worker_main())

from lmsp_tray.cli.main import main

raise SystemExit(main())
