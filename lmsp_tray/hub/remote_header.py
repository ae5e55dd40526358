"""Reading a GGUF header while the file is still on the Hub, to size a model before downloading it.

The header holds what the load planner needs (layers, heads, trained
context); it is the first few megabytes of the file. `RangeReader` is a
read-only file object over a remote file that fetches what the header reader
asks for with ``Range`` requests, in blocks of at least `BLOCK` bytes, and
refuses to fetch more than `MAX_BYTES` in all (a header is never that big).
"""

from __future__ import annotations

import io
import logging

from lmsp_tray.discovery.entry import GGUFInfo
from lmsp_tray.discovery.gguf_header import GGUFError, read_gguf_info_from
from lmsp_tray.errors import LMSPError
from lmsp_tray.hub.remote import HubClient, Location

log = logging.getLogger("lmsp_tray.hub")

BLOCK = 256 << 10
MAX_BYTES = 64 << 20


class RangeReader(io.RawIOBase):
    """``read``/``seek`` over the bytes of a remote file, fetched on demand."""

    def __init__(self, client: HubClient, location: Location, size: int) -> None:
        super().__init__()
        self._client, self._location, self._size = client, location, size
        self._pos = 0
        self._base = 0
        self._data = b""
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._pos
        n = max(0, min(n, self._size - self._pos))
        if n == 0:
            return b""
        start = self._pos - self._base
        if not (0 <= start and start + n <= len(self._data)):
            want = max(n, BLOCK)
            end = min(self._size, self._pos + want) - 1
            if self.fetched + (end - self._pos + 1) > MAX_BYTES:
                raise OSError(f"the header is over {MAX_BYTES >> 20} MiB; not reading further")
            self._data = self._client.read_range(self._location, self._pos, end)
            self.fetched += len(self._data)
            self._base = self._pos
            start = 0
        out = self._data[start : start + n]
        self._pos += len(out)
        return out


def remote_info(client: HubClient, location: Location, size: int) -> GGUFInfo | None:
    """The header facts of a remote GGUF file, or None when they cannot be read (then sizes alone count)."""
    reader = RangeReader(client, location, size)
    try:
        return read_gguf_info_from(reader, size)  # type: ignore[arg-type]
    except (GGUFError, OSError, LMSPError) as exc:
        log.info("could not read the header of %s before downloading: %s", location.path, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a sizing hint must never fail a pull
        log.info("could not read the header of %s before downloading: %s", location.path, type(exc).__name__)
        return None
