"""Proving an input too long for a context window without tokenizing all of it.

Why a module: a request far over the window must be refused at a cost that does not grow with it.
Tokenizing a 7 MiB prompt takes seconds of a core, and until this answer is given the CPU it costs is
taken from the streams decoding beside it. Two proofs, the cheaper first:

- `text_floor`, before anything is rendered: no token stands for more characters than the
  vocabulary's longest piece, so a conversation whose messages hold `window * longest` characters of
  text needs more than `window` tokens, whatever its template adds (templates render each system and
  user message's text, trimmed; none drops one). It costs a sum over the messages' lengths
  (5 ms for 23,000 messages, paid where the body was parsed: `ResponseRequest.settle`), against
  35 ms of the service's interpreter lock to convert and start rendering them and 28-58 ms of the
  model process's CPU to tokenize the probe below
  (`benchmarks/loop_stall.py`'s 8 MiB bodies, `py-spy --gil`).
- `token_floor`, on the rendered prompt's start: a prompt far over the window (more than
  `PROBE_CHARS_PER_TOKEN` characters a token) is refused when its first characters alone are more
  tokens than the window holds. Nearer the window, both prove nothing and the prompt is tokenized whole.
"""

from __future__ import annotations

from collections.abc import Callable

from lmsp_tray.protocol.requests import ResponseRequest

PROBE_CHARS_PER_TOKEN = 8  # a prompt over `window * this` characters is probed before it is tokenized whole
PROBE_SLACK_TOKENS = 64  # what cutting a text in two can add to its tokens, and far more
RENDERED_ROLES = frozenset({"system", "user"})  # whose text every template renders (some drop past reasoning)


def probe_chars(window: int) -> int:
    """How many of a prompt's first characters `token_floor` tokenizes; it needs twice as many to try."""
    return (window + PROBE_SLACK_TOKENS) * PROBE_CHARS_PER_TOKEN


def token_floor(tokenize: Callable[[str], list[int]], prompt: str, window: int) -> int | None:
    """For a prompt far longer than a context window could hold, a token count it certainly reaches.

    Tokenizing a 7 MiB prompt costs seconds of a core; its first ``window *
    PROBE_CHARS_PER_TOKEN`` characters, cut between words, cost milliseconds.
    When that prefix alone has more than ``window`` tokens (less a slack for
    the cut), so has the whole prompt. None: no such proof; tokenize it all.
    """
    probe = probe_chars(window)
    if len(prompt) < 2 * probe:
        return None
    cut = prompt.rfind(" ", probe // 2, probe)
    floor = len(tokenize(prompt[: cut if cut > 0 else probe])) - PROBE_SLACK_TOKENS
    return floor if floor >= window else None


def text_floor(request: ResponseRequest, longest_piece: int) -> int:
    """Tokens `request`'s conversation certainly renders to: its system and user messages' characters
    over the most characters one token stands for (`longest_piece`, in bytes: never fewer than
    characters). Assistant turns are left out (a template may drop their reasoning), and so are
    messages with images (an image's marker becomes one slot, not its characters' tokens)."""
    chars = sum(request.text_chars.get(role, 0) for role in RENDERED_ROLES)  # worked out where it was parsed
    return -(-chars // max(1, longest_piece))
