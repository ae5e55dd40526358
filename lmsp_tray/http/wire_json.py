"""The one JSON encoding the service sends: compact UTF-8, safe for every client's line splitter.

SSE ends lines only at CR and LF, but many clients split a stream with `str.splitlines()`
(httpx's `iter_lines` among them), which also breaks at U+0085, U+2028 and U+2029. JSON
leaves those three raw inside strings, so a model that generates one would cut an event's
`data` line in half for such a client. They can only occur inside JSON strings, so sending
them as `\\u` escapes changes nothing for a JSON parser and keeps every event on one line.
"""

from __future__ import annotations

import json
from typing import Any

from lmsp_tray.protocol.strict_json import safe_text

_LINE_BREAKERS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def dumps(value: Any) -> str:
    """Compact JSON text, non-ASCII kept as UTF-8 except the three line breakers above.

    A lone surrogate (a string that is not Unicode) goes out as U+FFFD: the request decoder refuses
    them, so this only guards what was stored before it did — one bad value never breaks a listing."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if not text.isascii():
        text = safe_text(text).translate(_LINE_BREAKERS)
    return text


def dumpb(value: Any) -> bytes:
    return dumps(value).encode("utf-8")
