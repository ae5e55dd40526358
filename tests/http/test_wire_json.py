"""The service's JSON text: compact UTF-8 that no line splitter can cut."""

from __future__ import annotations

import json

from lmsp_tray.http import wire_json
from lmsp_tray.http.sse import encode_event
from lmsp_tray.protocol.events import Event


def test_line_breaking_characters_are_escaped_and_round_trip() -> None:
    value = {"delta": "x\u2028y\u2029z\x85w\r\n\x1c é 漢 🙂"}
    text = wire_json.dumps(value)
    assert json.loads(text) == value
    assert len(text.splitlines()) == 1
    assert "é 漢 🙂" in text  # other non-ASCII stays UTF-8


def test_an_event_keeps_its_lines_for_any_splitter() -> None:
    raw = encode_event(Event(7, "response.output_text.delta", {"delta": "a\u2028b\x85c\u2029d"})).decode()
    lines = raw.splitlines()
    assert lines[:2] == ["id: 7", "event: response.output_text.delta"] and lines[3:] == [""]
    assert lines[2].startswith("data: ")
    assert json.loads(lines[2][6:]) == {"delta": "a\u2028b\x85c\u2029d"}
