"""`python -m lmsp_tray` runs the command-line entry point; the frozen program, which cannot run
`-m`, also starts the model process's modules through it (`engine.launch`): with the worker flag
a model process (`runner.worker`), with the probe flag the device probe (`runner.probe`). A spawned
multiprocessing worker (`http.body_parser`) starts through `freeze_support` in the frozen program (elsewhere a
no-op)."""

import multiprocessing
import sys

multiprocessing.freeze_support()

if len(sys.argv) > 1 and sys.argv[1] == "--lmsp-model-worker":
    from lmsp_tray.runner.worker import main as worker_main

    raise SystemExit(worker_main())

if len(sys.argv) > 1 and sys.argv[1] == "--lmsp-device-probe":
    from lmsp_tray.runner.probe import main as probe_main

    raise SystemExit(probe_main())

from lmsp_tray.cli.main import main

raise SystemExit(main())
