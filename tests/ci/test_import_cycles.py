"""The CI check for import circles (.ci/import_cycles.py) on tiny packages written into tmp_path."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "import_cycles.py"


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in {p.parent for p in package.rglob("*.py")} | {package}:
        (folder / "__init__.py").touch()
    return package


def run(package: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(package)], capture_output=True, text=True)


def test_a_package_without_a_circle_passes(tmp_path: Path, checker: ModuleType) -> None:
    package = write_package(
        tmp_path,
        {
            "low.py": "import json\nVALUE = 1\n",
            "mid.py": "from . import low\nfrom pkg.low import VALUE\n",
            "top.py": "import pkg.mid\nfrom .sub import leaf\n",
            "sub/leaf.py": "from ..low import VALUE\n",
        },
    )
    assert checker.find_cycles(package) == []
    edges = {(e.source, e.target) for e in checker.import_edges(package)}
    assert edges == {
        ("pkg.mid", "pkg.low"),
        ("pkg.top", "pkg.mid"),
        ("pkg.top", "pkg.sub.leaf"),
        ("pkg.sub.leaf", "pkg.low"),
    }
    result = run(package)
    assert result.returncode == 0, result.stdout
    assert "no circle" in result.stdout


def test_a_circle_made_by_a_relative_import_inside_a_function_fails(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "one.py": "from . import two\n",
            "two.py": "def later():\n    from .one import helper\n    return helper\n",
        },
    )
    result = run(package)
    assert result.returncode == 1
    assert "pkg.one -> pkg.two -> pkg.one" in result.stdout
    assert f"{package / 'two.py'}:2: pkg.two imports pkg.one" in result.stdout


def test_an_import_for_type_hints_only_still_makes_a_circle(tmp_path: Path, checker: ModuleType) -> None:
    package = write_package(
        tmp_path,
        {
            "model.py": "from pkg.scheduler import run\n",
            "scheduler.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.model import Model\ndef run(): ...\n"
            ),
        },
    )
    [(members, cycle)] = checker.find_cycles(package)
    assert members == ["pkg.model", "pkg.scheduler"]
    assert [(e.source, e.target, e.line) for e in cycle] == [
        ("pkg.model", "pkg.scheduler", 1),
        ("pkg.scheduler", "pkg.model", 3),
    ]


def test_a_package_that_imports_its_own_module_back_is_a_circle(tmp_path: Path, checker: ModuleType) -> None:
    """``from pkg.api import build`` in ``pkg/api/__init__`` and ``from pkg.api import X`` in a part of it."""
    package = write_package(
        tmp_path,
        {
            "api/__init__.py": "from pkg.api.document import build\nSHARED = 1\n",
            "api/document.py": "from pkg.api import SHARED\ndef build(): ...\n",
        },
    )
    [(members, _)] = checker.find_cycles(package)
    assert members == ["pkg.api", "pkg.api.document"]


def test_every_circle_is_reported_with_its_shortest_cycle(tmp_path: Path, checker: ModuleType) -> None:
    package = write_package(
        tmp_path,
        {
            "a.py": "import pkg.b\n",
            "b.py": "import pkg.c\n",
            "c.py": "import pkg.a\nimport pkg.b\n",
            "x.py": "from pkg import y\n",
            "y.py": "from pkg import x\n",
            "z.py": "from pkg import a, x\n",
        },
    )
    circles = checker.find_cycles(package)
    assert [members for members, _ in circles] == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.x", "pkg.y"]]
    assert [e.target for e in circles[0][1]] == ["pkg.b", "pkg.c", "pkg.a"]
    result = run(package)
    assert result.returncode == 1
    assert "2 circle(s)" in result.stdout
