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
    """``read``/``seek`` over the bytes of a remote file, fetched on demand in `BLOCK`-aligned blocks, kept."""

    def __init__(self, client: HubClient, location: Location, size: int) -> None:
        super().__init__()
        self._client, self._location, self._size = client, location, size
        self._pos = 0
        self._blocks: dict[int, bytes] = {}
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

    def _fetch(self, first: int, last: int) -> None:
        """Blocks first..last (all missing) in one request."""
        start, end = first * BLOCK, min(self._size, (last + 1) * BLOCK) - 1
        if self.fetched + (end - start + 1) > MAX_BYTES:
            raise OSError(f"the header is over {MAX_BYTES >> 20} MiB; not reading further")
        data = self._client.read_range(self._location, start, end)
        if len(data) != end - start + 1:
            raise OSError("the server sent a short range")
        self.fetched += len(data)
        for index in range(first, last + 1):
            self._blocks[index] = data[(index - first) * BLOCK : (index - first + 1) * BLOCK]

    def read(self, n: int | None = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        out = bytearray()
        while self._pos < end:
            index = self._pos // BLOCK
            if index not in self._blocks:
                last = index
                while last < (end - 1) // BLOCK and last + 1 not in self._blocks:
                    last += 1
                self._fetch(index, last)
            block = self._blocks[index]
            piece = block[self._pos - index * BLOCK : end - index * BLOCK]
            if not piece:
                break
            out += piece
            self._pos += len(piece)
        return bytes(out)


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
