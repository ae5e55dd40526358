"""The command line: `lmsp-tray` and its subcommands (`main`), and the token commands (`tokens`)."""
