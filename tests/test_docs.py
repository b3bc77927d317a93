"""The design lives in the repository: every docs link resolves, and nothing cites a document outside it."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REQUIRED_DOCS = ("architecture.md", "glossary.md", "storage-format.md", "catalog.md", "errors.md")

# `docs/file.md#anchor` as written in code comments, docstrings and tests.
_CODE_LINK = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)(?:#([A-Za-z0-9_-]+))?")
# `[text](target)` in Markdown.
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
# What a citation of the outside specification looks like.
_CITATION = re.compile(r"§|seed 0[0-9]|# ?C[1-5]\b|_rung[0-9]|def test_[0-9]|def test_\w*_[pr][0-9]_|\b0[0-8] #[0-9]")


def _sources() -> list[Path]:
    return sorted(path for folder in ("src", "tests", "bench") for path in ROOT.joinpath(folder).rglob("*.py"))


def _markdown() -> list[Path]:
    return sorted([*DOCS.glob("*.md"), *ROOT.glob("*.md")])


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces become hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    kept = [ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN"]
    return "".join(kept).replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    """Every anchor a Markdown file defines (duplicates get GitHub's `-1`, `-2` suffixes)."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


def _problem(target: Path, anchor: str | None) -> str | None:
    if not target.exists():
        return f"{target.relative_to(ROOT)} does not exist"
    if anchor and target.suffix == ".md" and anchor not in _anchors(target):
        return f"{target.relative_to(ROOT)} has no heading for #{anchor}"
    return None


@pytest.mark.parametrize("name", REQUIRED_DOCS)
def test_the_design_documents_exist(name: str) -> None:
    """Each design document a newcomer needs is in the repository."""
    assert (DOCS / name).is_file()


def test_every_docs_link_in_code_and_tests_resolves() -> None:
    """Every `docs/<file>.md#<anchor>` written in src/, tests/ or bench/ names an existing file and heading."""
    problems = []
    for source in _sources():
        if source == Path(__file__).resolve():
            continue
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for match in _CODE_LINK.finditer(line):
                problem = _problem(DOCS / match.group(1), match.group(2))
                if problem:
                    problems.append(f"{source.relative_to(ROOT)}:{number}: {problem}")
    assert problems == []


def test_every_relative_link_in_the_markdown_resolves() -> None:
    """Every relative link in docs/ and the top-level Markdown files names an existing file and heading."""
    problems = []
    for page in _markdown():
        fenced = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if _FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            for match in _MD_LINK.finditer(line):
                target = match.group(1)
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # an absolute URL (https:, mailto:)
                path_part, _, anchor = target.partition("#")
                resolved = (page.parent / path_part).resolve() if path_part else page
                problem = _problem(resolved, anchor or None)
                if problem:
                    problems.append(f"{page.relative_to(ROOT)}:{number}: {problem}")
    assert problems == []


def test_code_and_tests_cite_no_outside_specification() -> None:
    """No source, test or benchmark names a section or requirement number of a document outside the repository."""
    hits = []
    for source in _sources():
        if source == Path(__file__).resolve():
            continue
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if _CITATION.search(line):
                hits.append(f"{source.relative_to(ROOT)}:{number}: {line.strip()}")
    assert hits == []


def test_the_readme_points_only_inside_the_repository() -> None:
    """The README links the docs and no longer sends readers to a specification outside the repository."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../shared" not in readme
    for name in REQUIRED_DOCS:
        assert f"docs/{name}" in readme
