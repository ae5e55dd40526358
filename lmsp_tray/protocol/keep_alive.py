"""How long a model stays loaded once idle, as a request or a setting gives it.

Why a module: three spellings meet here — seconds, None ("never unload") and "not said, use the
configured keep-alive" — and the last must not be a bare string mixed into `float | None`, where mypy
could not tell it apart. The manager (`engine.manager`) applies it; the APIs that let a request set it
(Ollama's `keep_alive`, LMSP's load options) produce it.
"""

from __future__ import annotations

import enum
from typing import TypeAlias


class KeepAliveDefault(enum.Enum):
    """A keep-alive a caller did not set: the configured default (a type of its own, so mypy tells it
    from seconds and from None, which is "never")."""

    DEFAULT = "default"


DEFAULT = KeepAliveDefault.DEFAULT
KeepAlive: TypeAlias = float | None | KeepAliveDefault  # seconds idle before unloading; None: never
