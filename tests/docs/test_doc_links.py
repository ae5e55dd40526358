"""Every relative link in README.md and docs/ leads somewhere: the file exists, and a `#section` names a heading.

Why: the README is a short front door and the rest lives in docs/, so the two are held together by
links alone; a file moved or a heading reworded would otherwise leave a newcomer at a dead end.
Links to the web are not followed (tests do not reach the network). Anchors are GitHub's: the
heading in lower case, punctuation dropped, spaces as hyphens, or an explicit `{#id}`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.MULTILINE)
EXPLICIT_ID = re.compile(r"\{#([^}]+)\}\s*$")


def prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are code, not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The `#fragment`s GitHub gives the headings of a page."""
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        explicit = EXPLICIT_ID.search(heading)
        if explicit:
            found.add(explicit.group(1))
            heading = heading[: explicit.start()]
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        found.add(slug)
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_pages_are_found() -> None:
    assert ROOT / "README.md" in PAGES
    assert ROOT / "docs" / "lmsp" / "PROFILE.md" in PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading, with punctuation?\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-code-heading-with-punctuation) [ok](#here) [web](https://example.com/x)\n"
        "`[not a link](nowhere.md)`\n\n## Here\n\n[gone](missing.md) [bad](other.md#nothing)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["missing.md: no such file", "other.md#nothing: no such heading"]
