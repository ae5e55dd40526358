"""TextStream: UTF-8 split across tokens and stop strings across tokens."""

from __future__ import annotations

import random

from lmsp_tray.runner.textstream import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    out = [stream.push(p) for p in pieces]
    out.append(stream.flush())
    return out


def test_multibyte_character_split_over_tokens() -> None:
    text = "aж€🙂日本 done"
    data = text.encode()
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(data)), k=rng.randint(1, len(data) - 1)))
        pieces = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)])]
        deltas = feed(TextStream(), pieces)
        assert "".join(deltas) == text
        # No delta ever carries half a character (it would have been decoded as U+FFFD).
        assert all("\ufffd" not in d for d in deltas)


def test_invalid_bytes_become_replacement_characters() -> None:
    deltas = feed(TextStream(), [b"ok \xe2\x82", b" then", b" \xff end", b"\xf0\x9f"])
    assert "".join(deltas) == "ok \ufffd then \ufffd end\ufffd"


def test_stop_string_spanning_tokens_is_cut_exactly() -> None:
    stream = TextStream(["STOP"])
    deltas = [stream.push(p) for p in [b"hello S", b"T", b"OP and more"]]
    assert stream.stopped
    assert "".join(deltas) == "hello "
    assert stream.push(b"x") == "" and stream.flush() == ""


def test_partial_stop_prefix_is_released_when_it_turns_out_harmless() -> None:
    stream = TextStream(["</end>"])
    assert stream.push(b"a </e") == "a "
    assert stream.push(b"nx") == "</enx"
    assert not stream.stopped


def test_earliest_of_several_stops_wins() -> None:
    stream = TextStream(["world", "lo w"])
    assert stream.push(b"hello world") == "hel"
    assert stream.stopped
