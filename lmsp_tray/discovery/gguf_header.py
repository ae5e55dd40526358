"""Read what discovery needs from a GGUF file's header, never its weights.

A catalog scan touches every model file a user has, so this reader must be
cheap: it parses the GGUF key/value section itself (the `gguf` package's
reader maps the whole file and decodes every array), keeps the scalars and
strings, walks the big string arrays (`tokenizer.ggml.tokens`, `merges`)
without building them, and stops before the tensor data. The only token
strings it decodes are the BOS/EOS texts, found again through offsets it
noted on the way; when the metadata does not name the fill-in-the-middle
tokens it searches the vocabulary's raw bytes for their texts (`fim`). Then it reads the tensor table (names, shapes, types,
offsets: a few bytes per tensor) to learn where the weights must end, so a
download cut short in the weights is caught without reading them. A file
that is not GGUF, too old, truncated or absurd raises `GGUFError` with a
message meant for a person.

The reader reads with plain `read()` calls, not `mmap`: a file that shrinks
while it is mapped (a download restarted in place) would kill the whole
process with SIGBUS; with reads it is just a "truncated" error. It holds no
shared state, so any number of threads may read files at once.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, BinaryIO, TypeVar

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType, LlamaFileType

from lmsp_tray.discovery.entry import GGUFInfo
from lmsp_tray.discovery.fim import has_fim_tokens

T = TypeVar("T")

MAGIC = struct.pack("<I", GGUF_MAGIC)  # b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

# Sanity limits: a header claiming more than these is corrupt, not big.
MAX_KV_COUNT = 1 << 20
MAX_TENSOR_COUNT = 1 << 24
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 28
MAX_ARRAY_DEPTH = 4
MAX_DIMS = 8
SMALL_ARRAY = 4096  # numeric arrays up to this length are decoded (per-layer head counts)
TOKEN_CHECKPOINT = 64  # note the offset of every 64th token to find BOS/EOS texts later
MAX_VOCAB_SEARCH = 1 << 26  # a vocabulary's strings over this are not searched for FIM token texts

_FIRST_CHUNK = 1 << 16
_MAX_CHUNK = 1 << 23

_SCALARS: dict[int, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32 = _SCALARS[GGUFValueType.UINT32]
_U64 = _SCALARS[GGUFValueType.UINT64]

TOKENS_KEY = "tokenizer.ggml.tokens"


class GGUFError(Exception):
    """A file's GGUF header cannot be read; the message says why, for a person."""


class GGUFReadError(GGUFError):
    """The file could not be opened or read (permissions, I/O): may pass, so not cached."""


INCOMPLETE = "incomplete file, probably a download or copy that is still running or was cut short"


class GGUFIncomplete(GGUFError):
    """The file ends too early: still being written, or cut short. `info` is set when the whole
    header was read (only weights are missing), so the model keeps the id it will have when complete."""

    def __init__(self, message: str, info: GGUFInfo | None = None) -> None:
        super().__init__(message)
        self.info = info


def _rewrap(exc: GGUFError, where: str) -> GGUFError:
    """The same kind of error, saying where in the file it happened."""
    message = f"{exc} (while reading {where})"
    if isinstance(exc, GGUFIncomplete):
        return GGUFIncomplete(message, exc.info)
    return GGUFError(message)


class _Array:
    """Stands in for an array the reader skipped: only its length is kept."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class _Reader:
    """Sequential little-endian reads over a file, through a growing buffer."""

    __slots__ = ("_base", "_chunk", "_data", "_f", "pos", "size")

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self.size = size
        self._data = b""
        self._base = 0  # file offset of _data[0]
        self.pos = 0  # file offset of the next read
        self._chunk = _FIRST_CHUNK

    def _at(self, n: int) -> int:
        """Make the buffer cover [pos, pos+n) and return pos's index in it."""
        off = self.pos - self._base
        if off >= 0 and off + n <= len(self._data):
            return off
        if self.pos + n > self.size:
            raise _truncated(self.pos, self.size)
        want = max(n, self._chunk)
        self._chunk = min(self._chunk * 2, _MAX_CHUNK)
        end = self._base + len(self._data)
        if 0 <= off <= len(self._data):
            keep = self._data[off:]
            self._f.seek(end)
            data = keep + self._f.read(max(want - len(keep), 0))
        else:
            self._f.seek(self.pos)
            data = self._f.read(want)
        self._data = data
        self._base = self.pos
        if len(data) < n:  # the file shrank while we read it
            raise _truncated(self.pos, self.pos + len(data))
        return 0

    def scalar(self, st: struct.Struct) -> Any:
        off = self._at(st.size)
        self.pos += st.size
        return st.unpack_from(self._data, off)[0]

    def u32(self) -> int:
        return self.scalar(_U32)

    def u64(self) -> int:
        return self.scalar(_U64)

    def raw(self, n: int) -> bytes:
        off = self._at(n)
        self.pos += n
        return self._data[off : off + n]

    def string(self, limit: int = MAX_STRING_BYTES) -> str:
        n = self.u64()
        if n > limit:
            raise GGUFError(f"corrupt GGUF header: a string claims {n:,} bytes")
        if n > self.size - self.pos:
            raise _truncated(self.pos, self.size)
        return self.raw(n).decode("utf-8", "replace")

    def skip(self, n: int) -> None:
        if n > self.size - self.pos:
            raise _truncated(self.pos, self.size)
        self.pos += n

    def skip_strings(self, count: int, checkpoints: list[int] | None = None) -> None:
        """Step over `count` strings; note every TOKEN_CHECKPOINT-th start in `checkpoints`.

        The hot path steps a whole batch of TOKEN_CHECKPOINT strings with no
        per-string bounds checks (a 262k-token vocabulary is walked in ~30 ms),
        then checks once whether the batch stayed inside the buffer; near the
        buffer's end it falls back to careful single steps and refills.
        """
        unpack = _U64.unpack_from
        batch = TOKEN_CHECKPOINT
        steps = range(batch)
        i = 0
        while i < count:
            off = self._at(8)
            data = self._data
            end = len(data)
            while not i % batch and count - i >= batch:
                o = off
                try:
                    for _ in steps:
                        o += 8 + unpack(data, o)[0]
                except (struct.error, OverflowError):  # ran off the buffer mid-batch
                    break
                if o > end:
                    break
                if checkpoints is not None:
                    checkpoints.append(self._base + off)
                off = o
                i += batch
            while i < count and off + 8 <= end:
                nxt = off + 8 + unpack(data, off)[0]
                if nxt > end:
                    break
                if checkpoints is not None and not i % batch:
                    checkpoints.append(self._base + off)
                off = nxt
                i += 1
                if not i % batch and count - i >= batch:
                    break  # back to whole batches
            self.pos = self._base + off
            if i < count and off + 8 <= end and off + 8 + unpack(data, off)[0] > end:
                length = unpack(data, off)[0]
                if length > MAX_STRING_BYTES:
                    raise GGUFError(f"corrupt GGUF header: a string claims {length:,} bytes")
                self._at(8 + length)  # the next string does not fit the buffer: grow it

    def string_lengths(self, count: int) -> list[int]:
        """The byte lengths of the next `count` strings, stepping over them (as `skip_strings`)."""
        unpack = _U64.unpack_from
        lengths: list[int] = []
        add = lengths.append
        i = 0
        while i < count:
            off = self._at(8)
            data = self._data
            end = len(data)
            while i < count and off + 8 <= end:
                n = unpack(data, off)[0]
                if off + 8 + n > end:
                    break
                add(n)
                off += 8 + n
                i += 1
            self.pos = self._base + off
            if i < count:
                length = unpack(data, off)[0] if off + 8 <= end else 0
                if length > MAX_STRING_BYTES:
                    raise GGUFError(f"corrupt GGUF header: a string claims {length:,} bytes")
                self._at(8 + length)  # the next string does not fit the buffer: grow it
        return lengths


# Block size and bytes per block of each ggml type, keyed by its number in the file.
_QUANT_SIZES: Mapping[int, tuple[int, int]] = MappingProxyType({int(k): v for k, v in GGML_QUANT_SIZES.items()})


def _truncated(offset: int, size: int) -> GGUFError:
    return GGUFIncomplete(
        f"{INCOMPLETE}: its GGUF header is truncated, it runs past the end of the file at byte {offset:,} "
        f"(the file has {size:,} bytes)"
    )


def _not_gguf(head: bytes) -> GGUFError:
    """Say what a file with the wrong magic seems to be instead."""
    guess = ""
    if head.startswith(b"version https://git-lfs"):
        guess = "it is a Git LFS pointer, not the model itself (fetch the real file, e.g. `git lfs pull`)"
    elif head[:4] in (b"lmgg", b"fmgg", b"tjgg", b"algg"):
        guess = "it is an old GGML/GGJT model from before GGUF; convert it with a current llama.cpp"
    elif head.lstrip()[:1] == b"<":
        guess = "it looks like an HTML/XML page, perhaps a failed download"
    elif head.lstrip()[:1] in (b"{", b"["):
        guess = "it looks like a JSON document"
    elif head[:4] == b"PK\x03\x04":
        guess = "it is a ZIP archive"
    elif len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30:
        guess = "it looks like a safetensors file"
    elif head[:4] == b"FUGG":
        guess = "it is a big-endian GGUF file, which this little-endian machine cannot use"
    detail = f"; {guess}" if guess else ""
    return GGUFError(f'not a GGUF model file: it starts with {describe_bytes(head[:4])} instead of "GGUF"{detail}')


def describe_bytes(data: bytes) -> str:
    """Bytes as a person reads them: `"PK.."` when they are letters, else `the bytes E2 BD CB 5F`."""
    if data and all(32 <= b < 127 for b in data):
        return '"' + data.decode("ascii") + '"'
    return "the bytes " + " ".join(f"{b:02X}" for b in data) if data else "nothing"


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """The header facts of the GGUF file at `path`; raises `GGUFError` when it has none."""
    return _read_file(path, _parse)


def _read_file(path: str | os.PathLike[str], read: Callable[[_Reader], T]) -> T:
    """`read` over the file at `path`; a file that cannot be opened or read is a `GGUFReadError`."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the `with f` below; opening fails apart
    except OSError as exc:
        raise GGUFReadError(f"cannot open the file: {exc.strerror or exc}") from None
    with f:
        try:
            return read(_Reader(f, os.fstat(f.fileno()).st_size))
        except OSError as exc:
            raise GGUFReadError(f"cannot read the file: {exc.strerror or exc}") from None


def read_gguf_info_from(f: BinaryIO, size: int) -> GGUFInfo:
    """The header facts of a GGUF file of `size` bytes behind any seekable reader (e.g. ranges of a
    file still on a server, before downloading it); raises `GGUFError` when it has none."""
    try:
        return _parse(_Reader(f, size))
    except OSError as exc:
        raise GGUFReadError(f"cannot read the file: {exc.strerror or exc}") from None


def token_text_lengths(path: str | os.PathLike[str]) -> list[int] | None:
    """The byte length of each token's text in the vocabulary (`tokenizer.ggml.tokens`, by token id),
    read from the header without building the strings (~0.1 s for 262,144 tokens); None when the file
    has no such array. Raises `GGUFError` as `read_gguf_info` does."""
    return _read_file(path, _token_text_lengths)


def _token_text_lengths(r: _Reader) -> list[int] | None:
    _, n_kv = _head(r)
    for _ in range(n_kv):
        key = r.string(MAX_KEY_BYTES)
        vtype = r.u32()
        if key == TOKENS_KEY and vtype == GGUFValueType.ARRAY:
            etype, count = r.u32(), r.u64()
            if etype != GGUFValueType.STRING or count * 8 > r.size - r.pos:
                return None
            return r.string_lengths(count)
        _value(r, vtype, key, None, 0)
    return None


def _head(r: _Reader) -> tuple[int, int]:
    """The file's tensor and metadata counts, after checking its magic and version; `r` at its metadata."""
    if r.size == 0:
        raise GGUFIncomplete("empty file (0 bytes), probably a download or copy that has not started or failed")
    head = r.raw(min(r.size, 64))
    r.pos = 0
    if head[:4] != MAGIC:
        raise _not_gguf(head)
    if r.size < 24:
        raise _truncated(r.size, r.size)
    r.pos = 4
    version = r.u32()
    if version not in SUPPORTED_VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in (1, 2, 3):
            raise GGUFError("a big-endian GGUF file, which this little-endian machine cannot use")
        if version == 1:
            raise GGUFError("GGUF version 1 is too old to read; re-convert the model with a current llama.cpp")
        raise GGUFError(f"unsupported GGUF version {version} (this reader knows versions 2 and 3)")
    n_tensors = r.u64()
    n_kv = r.u64()
    if n_tensors > MAX_TENSOR_COUNT:
        raise GGUFError(f"corrupt GGUF header: it claims {n_tensors:,} tensors")
    if n_kv > MAX_KV_COUNT:
        raise GGUFError(f"corrupt GGUF header: it claims {n_kv:,} metadata entries")
    return n_tensors, n_kv


def _parse(r: _Reader) -> GGUFInfo:
    n_tensors, n_kv = _head(r)
    kv: dict[str, Any] = {}
    checkpoints: list[int] = []
    vocab: tuple[int, int] | None = None
    key = ""
    i = 0
    try:
        for i in range(n_kv):
            key = ""
            key = r.string(MAX_KEY_BYTES)
            vtype = r.u32()
            kv[key] = _value(r, vtype, key, checkpoints if key == TOKENS_KEY else None, 0)
            if key == TOKENS_KEY and checkpoints:
                vocab = (checkpoints[0], r.pos)  # where the token strings start and end
    except GGUFError as exc:
        where = f"metadata {key!r}" if key else f"metadata entry {i + 1} of {n_kv}"
        raise _rewrap(exc, where) from None
    try:
        weights_end, data_start = _tensor_table(r, n_tensors, kv)
    except GGUFError as exc:
        raise _rewrap(exc, "the tensor table") from None
    bos = _token_text(r, kv, checkpoints, "tokenizer.ggml.bos_token_id")
    eos = _token_text(r, kv, checkpoints, "tokenizer.ggml.eos_token_id")
    tokens = kv.get(TOKENS_KEY)
    fim = has_fim_tokens(
        kv,
        tokens.count if isinstance(tokens, _Array) else 0,
        lambda: _vocab_bytes(r, vocab),
        [c - checkpoints[0] for c in checkpoints],
    )
    info = _info(kv, n_tensors, bos, eos, fim)
    if weights_end is not None and weights_end > r.size:
        missing = weights_end - r.size
        share = 100 * missing / max(weights_end - data_start, 1)
        raise GGUFIncomplete(
            f"{INCOMPLETE}: it has {r.size:,} bytes but its weights end at byte {weights_end:,}, so "
            f"{missing:,} byte{'s' if missing != 1 else ''} ({share:.1f}% of the weights) are missing (truncated)",
            info,
        )
    return info


def _tensor_table(r: _Reader, n_tensors: int, kv: dict[str, Any]) -> tuple[int | None, int]:
    """Read the tensor table: (the byte where the weights end or None if unknown, where they start).

    Entries are parsed straight from the buffer while they fit in it (the
    table of a real model has hundreds of entries); an entry that crosses the
    buffer's end is read with the checked reader, which refills it or reports
    the truncation.
    """
    end = 0
    sizes_known = True
    u32, u64 = _U32.unpack_from, _U64.unpack_from
    sizes = _QUANT_SIZES
    i = 0
    while i < n_tensors:
        off = r._at(min(r.size - r.pos, max(_FIRST_CHUNK, (n_tensors - i) * 160)))
        data = r._data
        limit = len(data)
        while i < n_tensors:
            try:
                name_len = u64(data, off)[0]
                p = off + 8 + name_len
                n_dims = u32(data, p)[0]
                if n_dims > MAX_DIMS:
                    break  # the checked reader names the problem
                count = 1
                for d in range(n_dims):
                    count *= u64(data, p + 4 + 8 * d)[0]
                p += 4 + 8 * n_dims
                ggml_type = u32(data, p)[0]
                offset = u64(data, p + 4)[0]
            except (struct.error, OverflowError):
                break
            p += 12
            if p > limit or name_len > MAX_KEY_BYTES:
                break
            block = sizes.get(ggml_type)
            if block is None:  # a type newer than this gguf package: cannot size it
                sizes_known = False
            else:
                end = max(end, offset + count // block[0] * block[1])
            off = p
            i += 1
        r.pos = r._base + off
        if i < n_tensors:  # one entry the fast path could not take
            count, ggml_type, offset = _tensor_entry(r)
            block = sizes.get(ggml_type)
            if block is None:
                sizes_known = False
            else:
                end = max(end, offset + count // block[0] * block[1])
            i += 1
    alignment = _int(kv.get("general.alignment")) or GGUF_DEFAULT_ALIGNMENT
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"corrupt GGUF header: general.alignment is {alignment}, not a power of two")
    data_start = -(-r.pos // alignment) * alignment
    return (data_start + end if sizes_known else None), data_start


def _tensor_entry(r: _Reader) -> tuple[int, int, int]:
    """One tensor table entry with every read checked: (element count, ggml type, data offset)."""
    r.string(MAX_KEY_BYTES)
    n_dims = r.u32()
    if n_dims > MAX_DIMS:
        raise GGUFError(f"corrupt GGUF header: a tensor claims {n_dims} dimensions")
    count = 1
    for _ in range(n_dims):
        count *= r.u64()
    ggml_type = r.u32()
    return count, ggml_type, r.u64()


def _value(r: _Reader, vtype: int, key: str, checkpoints: list[int] | None, depth: int) -> Any:
    st = _SCALARS.get(vtype)
    if st is not None:
        return r.scalar(st)
    if vtype == GGUFValueType.STRING:
        return r.string()
    if vtype != GGUFValueType.ARRAY:
        raise GGUFError(f"corrupt GGUF header: unknown value type {vtype}")
    etype = r.u32()
    count = r.u64()
    room = r.size - r.pos
    st = _SCALARS.get(etype)
    if st is not None:
        if count * st.size > room:
            raise _too_long(count, r)
        if count <= SMALL_ARRAY:
            off = r._at(count * st.size)
            r.pos += count * st.size
            return struct.unpack_from(f"<{count}{st.format[-1]}", r._data, off)
        r.skip(count * st.size)
        return _Array(count)
    if count * 8 > room:
        raise _too_long(count, r)
    if etype == GGUFValueType.STRING:
        r.skip_strings(count, checkpoints)
        return _Array(count)
    if etype == GGUFValueType.ARRAY and depth < MAX_ARRAY_DEPTH:
        for _ in range(count):
            _value(r, GGUFValueType.ARRAY, key, None, depth + 1)
        return _Array(count)
    raise GGUFError(f"corrupt GGUF header: unknown or too deeply nested array element type {etype}")


def _too_long(count: int, r: _Reader) -> GGUFError:
    return GGUFIncomplete(
        f"{INCOMPLETE} (or a corrupt one): its GGUF header is truncated, an array claims {count:,} items, "
        f"more than the {r.size - r.pos:,} bytes left in the file can hold"
    )


def _token_text(r: _Reader, kv: dict[str, Any], checkpoints: list[int], id_key: str) -> str | None:
    tokens = kv.get(TOKENS_KEY)
    token_id = kv.get(id_key)
    if not isinstance(tokens, _Array) or not isinstance(token_id, int) or not checkpoints:
        return None
    if not 0 <= token_id < tokens.count:
        return None
    r.pos = checkpoints[token_id // TOKEN_CHECKPOINT]
    r.skip_strings(token_id % TOKEN_CHECKPOINT)
    return r.string()


def _vocab_bytes(r: _Reader, span: tuple[int, int] | None) -> bytes | None:
    """The raw token strings (each an 8-byte length and its bytes), read again for the FIM search."""
    if span is None or span[1] - span[0] > MAX_VOCAB_SEARCH:
        return None
    r.pos = span[0]
    return r.raw(span[1] - span[0])


def _int(value: Any) -> int | None:
    """An int from a scalar, or the largest of a per-layer array (a safe upper bound)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return None


def _str(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def quantization_name(file_type: int | None) -> str | None:
    """ "Q4_K_M" for llama_ftype 15, "F16" for 1, ...; None when unknown or only guessed."""
    if file_type is None:
        return None
    try:
        member = LlamaFileType(file_type & ~1024 if file_type > 1024 else file_type)
    except ValueError:
        return None
    if member is LlamaFileType.GUESSED:
        return None
    name = member.name
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _info(kv: dict[str, Any], n_tensors: int, bos: str | None, eos: str | None, fim: bool) -> GGUFInfo:
    arch = _str(kv.get("general.architecture"))

    def a(name: str) -> int | None:
        return _int(kv.get(f"{arch}.{name}")) if arch else None

    file_type = _int(kv.get("general.file_type"))
    tokens = kv.get(TOKENS_KEY)
    return GGUFInfo(
        architecture=arch,
        name=_str(kv.get("general.name")),
        basename=_str(kv.get("general.basename")),
        size_label=_str(kv.get("general.size_label")),
        file_type=file_type,
        quantization=quantization_name(file_type),
        context_length=a("context_length"),
        block_count=a("block_count"),
        embedding_length=a("embedding_length"),
        head_count=a("attention.head_count"),
        head_count_kv=a("attention.head_count_kv"),
        key_length=a("attention.key_length"),
        value_length=a("attention.value_length"),
        chat_template=kv.get("tokenizer.chat_template") if isinstance(kv.get("tokenizer.chat_template"), str) else None,
        bos_token=bos,
        eos_token=eos,
        split_count=max(1, _int(kv.get("split.count")) or 1),
        parameter_count=_int(kv.get("general.parameter_count")),
        general_type=_str(kv.get("general.type")),
        tensor_count=n_tensors,
        vocab_size=tokens.count if isinstance(tokens, _Array) else None,
        split_index=_int(kv.get("split.no")),
        pooling_type=a("pooling_type"),
        fim_tokens=fim,
        vision_encoder=kv.get("clip.has_vision_encoder") is True,
        audio_encoder=kv.get("clip.has_audio_encoder") is True,
    )
