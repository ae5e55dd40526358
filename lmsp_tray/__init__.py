"""lmsp-tray: a resident desktop service serving local GGUF models over LMSP 1.0."""

__version__ = "0.1.0"
