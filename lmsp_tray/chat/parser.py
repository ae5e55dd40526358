"""The model's text deltas to output items: reasoning, message text and function calls.

`OutputParser` runs on the event-loop side between the engine's text deltas
and `ResponseAssembler`. It splits thinking (`<think>…</think>` and other
families' markers) from the answer and recognises the call formats of the
common families, streaming-safe: it holds back only text that could still
become a marker (and whitespace next to item boundaries), so concatenated
deltas always equal the final item texts. A call whose decoding is grammar-
constrained is streamed as it is generated (name first, then argument
deltas); an unconstrained one is buffered and becomes a `function_call` only
if it is well formed and names a declared tool, otherwise its text stays in
the message — malformed output never raises.

Operations are `(kind, payload)` pairs: `text`, `reasoning`, `call` (name),
`args` (delta) and `end`; `apply()` feeds them to a `ResponseAssembler`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lmsp_tray.chat.dialects import CallSyntax
from lmsp_tray.protocol.events import Event, ResponseAssembler

Op = tuple[str, str]
_HEAD_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(arguments|parameters)"\s*:\s*', re.DOTALL)
_WS = " \t\r\n"


@dataclass(frozen=True)
class ParserConfig:
    think: tuple[str, str] | None = None  # (open, close) thinking markers
    start_in_think: bool = False  # the prompt already opened the thinking block
    syntax: CallSyntax | None = None  # None: calls are never parsed (tool_choice none, no tools)
    tool_names: frozenset[str] = frozenset()


def apply(assembler: ResponseAssembler, ops: list[Op]) -> list[Event]:
    """Feed parser operations to the assembler; returns the events they produce."""
    events: list[Event] = []
    for kind, payload in ops:
        if kind == "text":
            events += assembler.text(payload)
        elif kind == "reasoning":
            events += assembler.reasoning(payload)
        elif kind == "call":
            events += assembler.function_call_start(payload)
        elif kind == "args":
            events += assembler.function_call_arguments(payload)
        elif kind == "end":
            events += assembler.close_item()
    return events


def _decode_call(obj: Any, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) from a parsed call object, or None when it is not a valid call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


class _ObjectCall:
    """Scans one JSON call object char by char: `{"name": …, "arguments": {…}}`.

    With `args_only`, the object *is* the arguments (Mistral `name[ARGS]{…}`)."""

    def __init__(self, names: frozenset[str], live: bool, args_only: str | None = None) -> None:
        self.names = names
        self.live = live
        self.args_only = args_only
        self.text = ""
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.phase = "head"  # head -> args -> tail (live); the object closes: done | bad
        self.started = False  # a `call` op was emitted
        self.state = "more"

    def push(self, data: str) -> tuple[int, list[Op]]:
        """Consume chars of `data` up to the end of the object; returns (consumed, ops)."""
        ops: list[Op] = []
        args: list[str] = []
        used = 0
        for ch in data:
            used += 1
            if self.depth == 0 and not self.text.strip() and ch in _WS:
                self.text += ch
                continue
            if self.depth == 0 and ch != "{":
                self.state = "bad"
                break
            self.text += ch
            opened = self._track(ch) and ch == "{"
            if self.phase == "head" and self.live and opened and self._begin_args(ops):
                args.append(ch)
                continue
            if self.phase == "args":
                args.append(ch)
                if self.depth == (0 if self.args_only else 1) and not self.in_str:
                    self.phase = "tail"
            if self.depth == 0:
                if args:
                    ops.append(("args", "".join(args)))
                    args = []
                self._close(ops)
                break
        if args:
            ops.append(("args", "".join(args)))
        return used, ops

    def _track(self, ch: str) -> bool:
        """Update nesting and string state; True when `ch` opened an object or array."""
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
            return False
        if ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
            return True
        elif ch in "}]":
            self.depth -= 1
        return False

    def _begin_args(self, ops: list[Op]) -> bool:
        """At the `{` opening a value: start streaming when it is the arguments of a known tool."""
        if self.args_only is not None:
            if self.depth == 1 and self.args_only in self.names:
                ops.append(("call", self.args_only))
                self.started, self.phase = True, "args"
                return True
            return False
        if self.depth != 2:
            return False
        match = _HEAD_RE.fullmatch(self.text[:-1])
        if match is None:
            return False
        try:
            name = json.loads(f'"{match.group(1)}"')
        except ValueError:
            return False
        if name not in self.names:
            return False
        ops.append(("call", name))
        self.started, self.phase = True, "args"
        return True

    def _close(self, ops: list[Op]) -> None:
        if self.started:
            ops.append(("end", ""))
            self.state = "done"
            return
        try:
            obj = json.loads(self.text)
        except ValueError:
            self.state = "bad"
            return
        call = _decode_call({"name": self.args_only, "arguments": obj} if self.args_only else obj, self.names)
        if call is None:
            self.state = "bad"
            return
        ops += [("call", call[0]), ("args", call[1]), ("end", "")]
        self.state = "done"


class OutputParser:
    """Turns text deltas into item operations; `feed()` per delta, `finish()` at the end."""

    def __init__(self, config: ParserConfig, *, constrained: bool = False) -> None:
        self.cfg = config
        self._constrained = constrained  # decoding is under a grammar (from the start, or since grammar_on)
        self._buf = ""
        self._state = "reasoning" if config.think and config.start_in_think else "message"
        self._segment_text = False  # message text emitted since the last item boundary
        self._drop_ws = bool(config.think and config.start_in_think)  # at the start of the next segment
        self._bare_ok = True  # a bare JSON call may start here (Llama 3: output start, after calls)
        self._items = 0  # reasoning blocks and calls so far
        # the call group being parsed
        self._kind = ""
        self._raw = ""  # call text since the group began (or since its last complete call)
        self._done = 0  # complete calls in this group
        self._obj: _ObjectCall | None = None
        self._live = False
        self._bracket = False
        markers: list[str] = []
        if config.think:
            markers.append(config.think[0])
        if config.syntax:
            markers.append(config.syntax.open)
        self._markers = markers

    def grammar_on(self) -> None:
        """The model switched its lazy grammar on: the call that opens next is constrained. Told in
        order with the text (the engine sends it before the text holding the call marker)."""
        self._constrained = True

    @property
    def passthrough(self) -> bool:
        return not self._markers

    def feed(self, text: str) -> list[Op]:
        if self.passthrough:
            return [("text", text)] if text else []
        self._buf += text
        return _merge(self._run(final=False))

    def finish(self) -> list[Op]:
        if self.passthrough:
            return []
        return _merge(self._run(final=True))

    # -- the state machine ----------------------------------------------------------------------
    def _run(self, final: bool) -> list[Op]:
        ops: list[Op] = []
        steps = {
            "message": self._message,
            "reasoning": self._reasoning,
            "call-start": self._call_start,
            "call-object": self._call_object,
            "call-after": self._call_after,
        }
        while True:
            before = (self._state, self._buf)
            steps[self._state](ops, final)
            if (self._state, self._buf) == before:
                break
        if final:
            self._flush(ops)
        return ops

    def _skip_leading_ws(self) -> bool:
        """Drop blanks that open a segment; False while only blanks have arrived."""
        if self._drop_ws:
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return False
            self._drop_ws = False
        return True

    def _message(self, ops: list[Op], final: bool) -> None:
        if not self._skip_leading_ws():
            return
        buf = self._buf
        syntax = self.cfg.syntax
        if syntax and syntax.bare_json and self._bare_ok and not self._segment_text:
            head = buf.lstrip(_WS)
            if head.startswith("{"):
                self._open_group("bare", "")
                self._buf = head
                return
            if not head and not final:
                return  # only whitespace so far: a bare call may still follow
        at, marker = _earliest(buf, self._markers)
        if marker is not None:
            self._text(ops, buf[:at].rstrip(_WS))
            self._buf = buf[at + len(marker) :]
            if self.cfg.think and marker == self.cfg.think[0]:
                self._state = "reasoning"
                self._drop_ws = True
                self._items += 1
            else:
                assert syntax is not None
                self._open_group(syntax.family, marker)
            return
        if final:
            return  # _flush decides about the rest
        keep = _partial_suffix(buf, self._markers)
        text = buf[: len(buf) - keep]
        text = text.rstrip(_WS)  # trailing blanks wait: a marker may follow them
        self._text(ops, text)
        self._buf = buf[len(text) :]

    def _text(self, ops: list[Op], text: str) -> None:
        if not text:
            return
        if not self._segment_text and self._items:
            text = text.lstrip(_WS)
        if text:
            ops.append(("text", text))
            self._segment_text = True
            self._bare_ok = False

    def _reasoning(self, ops: list[Op], final: bool) -> None:
        assert self.cfg.think is not None
        close = self.cfg.think[1]
        if not self._skip_leading_ws():
            return
        buf = self._buf
        at = buf.find(close)
        if at >= 0:
            text = buf[:at].rstrip(_WS)
            if text:
                ops.append(("reasoning", text))
            self._buf = buf[at + len(close) :]
            self._boundary()
            return
        if final:
            return
        keep = _partial_suffix(buf, [close])
        text = buf[: len(buf) - keep].rstrip(_WS)
        if text:
            ops.append(("reasoning", text))
        self._buf = buf[len(text) :]

    def _boundary(self) -> None:
        """An item ended: back to message text, dropping the blanks that follow."""
        self._state = "message"
        self._drop_ws = True
        self._segment_text = False

    # -- calls ----------------------------------------------------------------------------------
    def _open_group(self, kind: str, marker: str) -> None:
        self._state = "call-start"
        self._kind = kind
        self._raw = marker
        self._done = 0
        self._obj = None
        self._bracket = False
        self._live = self._constrained
        self._items += 1

    def _take(self, n: int) -> None:
        self._raw += self._buf[:n]
        self._buf = self._buf[n:]

    def _call_start(self, ops: list[Op], final: bool) -> None:
        head = self._buf.lstrip(_WS)
        if not head:
            return
        self._take(len(self._buf) - len(head))
        names = self.cfg.tool_names
        if self._kind == "mistral" and head[0] == "[" and not self._bracket and not self._done:
            self._bracket = True
            self._take(1)
            return
        if self._kind == "mistral-args":
            end = head.find("[ARGS]")
            if end < 0:
                if final or len(head) > 128:
                    self._give_up(ops)
                return
            name = head[:end].strip()
            self._take(end + len("[ARGS]"))
            self._obj = _ObjectCall(names, self._live, args_only=name)
            self._state = "call-object"
            return
        if head[0] != "{":
            self._give_up(ops)
            return
        self._obj = _ObjectCall(names, self._live)
        self._state = "call-object"

    def _call_object(self, ops: list[Op], final: bool) -> None:
        assert self._obj is not None
        used, call_ops = self._obj.push(self._buf)
        self._take(used)
        state = self._obj.state
        if state == "more":
            ops += call_ops
            return
        if state == "bad":
            if self._obj.started:  # cannot happen under a grammar: keep what was streamed
                ops += call_ops + [("end", "")]
                self._end_group()
            else:
                self._give_up(ops)
            return
        ops += call_ops
        self._done += 1
        self._raw = ""
        self._obj = None
        self._state = "call-after"

    def _call_after(self, ops: list[Op], final: bool) -> None:
        syntax = self.cfg.syntax
        assert syntax is not None
        head = self._buf.lstrip(_WS)
        kind = self._kind
        if kind == "hermes":
            close = syntax.close or ""
            if head.startswith(close):
                self._buf = head[len(close) :]
                self._end_group()
            elif final or (head and not close.startswith(head)):
                self._end_group()  # lenient: a well-formed call without its closing tag
            return
        if not head:
            if final:
                self._end_group()
            return
        if kind in ("llama3", "bare") and head[0] in ";{":
            self._take(len(self._buf) - len(head) + (head[0] == ";"))
            self._state = "call-start"
        elif kind == "mistral" and head[0] == ",":
            self._take(len(self._buf) - len(head) + 1)
            self._state = "call-start"
        elif kind == "mistral" and head[0] == "]":
            self._buf = head[1:]
            self._end_group()
        elif kind == "mistral-args" and head.startswith(syntax.open):
            self._take(len(self._buf) - len(head) + len(syntax.open))
            self._state = "call-start"
        elif kind == "mistral-args" and syntax.open.startswith(head) and not final:
            return
        else:
            self._end_group()

    def _end_group(self) -> None:
        self._obj = None
        self._raw = ""
        self._bare_ok = True
        self._boundary()

    def _give_up(self, ops: list[Op]) -> None:
        """What looked like a call is not one: its text goes back to the message, as written."""
        text = self._raw
        first = self._done == 0
        self._obj = None
        self._raw = ""
        if first:
            self._items -= 1
            self._state = "message"
            self._bare_ok = False
            if not self._segment_text and self._items:
                text = text.lstrip(_WS)
        else:
            self._boundary()
            text = text.lstrip(_WS)
            self._drop_ws = False
        if text:
            ops.append(("text", text))
            self._segment_text = True

    def _flush(self, ops: list[Op]) -> None:
        state = self._state
        if state == "message":
            # Trailing blanks stay only in a plain answer (no reasoning, no calls).
            if self._buf.strip(_WS) or not self._items:
                self._text_final(ops, self._buf)
        elif state == "reasoning":
            text = self._buf.strip(_WS)
            if text:
                ops.append(("reasoning", text))
        elif state == "call-object" and self._obj is not None and self._obj.started:
            pass  # a streamed call cut short: the assembler closes it as it stands
        elif state in ("call-start", "call-object"):
            self._raw += self._buf
            if self._done and not self._raw.strip(_WS):
                self._end_group()
            else:
                self._give_up(ops)
        self._buf = ""

    def _text_final(self, ops: list[Op], text: str) -> None:
        if not self._segment_text and self._items:
            text = text.lstrip(_WS)
        if text:
            ops.append(("text", text))
            self._segment_text = True


def _earliest(text: str, markers: list[str]) -> tuple[int, str | None]:
    best, which = -1, None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, marker
    return best, which


def _partial_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for n in range(min(len(text), len(marker) - 1), longest, -1):
            if marker.startswith(text[-n:]):
                longest = n
                break
    return longest


def _merge(ops: list[Op]) -> list[Op]:
    out: list[Op] = []
    for kind, payload in ops:
        if out and kind == out[-1][0] and kind in ("text", "reasoning", "args"):
            out[-1] = (kind, out[-1][1] + payload)
        else:
            out.append((kind, payload))
    return out
