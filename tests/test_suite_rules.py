"""The suite's own rules (pyproject.toml's [tool.pytest.ini_options]) hold, tried on throw-away test files.

A warning fails its test (`filterwarnings = ["error"]`), and so does an exception in a thread that
the test never sees (pytest reports it as PytestUnhandledThreadExceptionWarning, an error here);
an unregistered marker is refused (`--strict-markers`); an xfail that passes fails (`xfail_strict`).
Each file runs in a real pytest subprocess under this checkout's configuration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

BROKEN = {
    "a thread that raises": (
        "import threading\n\ndef test_it():\n    t = threading.Thread(target=lambda: 1 / 0)\n    t.start()\n    t.join()\n",
        "ZeroDivisionError",
    ),
    "a warning": (
        "import warnings\n\ndef test_it():\n    warnings.warn('old', DeprecationWarning)\n",
        "DeprecationWarning",
    ),
    "an unregistered marker": (
        "import pytest\n\n@pytest.mark.no_such_marker\ndef test_it():\n    pass\n",
        "no_such_marker",
    ),
    "an xfail that passes": (
        "import pytest\n\n@pytest.mark.xfail(reason='expected to fail')\ndef test_it():\n    pass\n",
        "XPASS(strict)",
    ),
}


def run_pytest(folder: Path, source: str, *options: str) -> subprocess.CompletedProcess:
    test = folder / "test_rule.py"
    test.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider", "-q"]
        + [*options, str(test)],
        cwd=folder,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_clean_test_passes_under_the_rules(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "import threading\n\ndef test_it():\n    threading.Thread(target=print).start()\n")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("case", BROKEN)
def test_the_rules_fail_the_test(tmp_path: Path, case: str) -> None:
    source, says = BROKEN[case]
    out = run_pytest(tmp_path, source)
    assert out.returncode != 0 and says in out.stdout + out.stderr, out.stdout + out.stderr


LEAK = """import gc
import socket


def test_leaks():
    gc.disable()  # nothing collects the cycle until the next test does
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    cycle = [client]
    cycle.append(cycle)
    server.close()


def test_bystander():
    gc.enable()
    gc.collect()
"""


def test_an_unclosed_socket_fails_a_later_test_which_names_the_test_and_line_that_connected_it(tmp_path: Path) -> None:
    """The collector finds a leaked socket in whichever test it runs; socket_origins.py (conftest.py loads it)
    adds to that failure the test that was running when the socket connected and the line that did it."""
    out = run_pytest(tmp_path, LEAK, "-p", "socket_origins")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "1 failed, 1 passed" in text and "::test_bystander - " in text, text
    section = text[text.index("socket origin") :]
    assert "::test_leaks ran, in thread 'MainThread', from:" in section, text
    line = LEAK.splitlines().index("    client = socket.create_connection(server.getsockname())") + 1
    assert f"test_rule.py:{line} in test_leaks" in section, text


SDK_CLIENT = re.compile(r"\b(?:openai\.(?:Async)?OpenAI|anthropic\.(?:Async)?Anthropic|ollama\.(?:Async)?Client)\(")


def test_every_sdk_client_a_test_makes_is_closed() -> None:
    """An SDK client left open keeps its pooled connection until the garbage collector finds it, and the
    ResourceWarning then fails whichever later test the collector runs in (test_openapi.py failed a full
    run for two clients test_errors_in_anthropic_shape made). So each is made in a `with`, handed to the
    `closing` fixture, closed by a finalizer or a `try` on the next line, or (an async client, closed in
    its own event loop) closed by name with `await <name>.close()` or `async with <name>`."""
    unclosed = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for i, line in enumerate(lines):
            found = SDK_CLIENT.search(line)
            if found is None or line.lstrip().startswith("#"):
                continue
            before, after = line[: found.start()], " ".join(lines[i + 1 : i + 2])
            named = re.match(r"\s*(\w+) = ", line)
            if (
                "with " in before
                or "closing(" in before
                or "with (" in lines[i - 1]
                or "addfinalizer" in after
                or after.strip() == "try:"
                or (named and re.search(rf"await {named[1]}\.close\(\)|async with {named[1]}\b", text))
            ):
                continue
            unclosed.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not unclosed, "SDK clients never closed:\n" + "\n".join(unclosed)
