"""`python -m lmsp_tray` runs the command-line entry point."""

from lmsp_tray.cli.main import main

raise SystemExit(main())
