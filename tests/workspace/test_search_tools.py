"""The search tools: `glob` includes hidden and ignored files, `grep` skips them, as the harness has it.

`grep` runs ripgrep when it is on `PATH` and searches in Python otherwise; both must pick the same
files (ignore rules, hidden files, binary files) and give the same result on the same tree.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dsh.agent.errors import ToolError
from dsh.tools.workspace import Workspace
from dsh.tools.workspace._search import python_grep, ripgrep
from tests.workspace.helpers import invoke, needs_rg, tools_by_name


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A git repository with ignored, hidden, binary and ordinary files, modified in a known order."""
    root = tmp_path / "repo"
    (root / ".git" / "info").mkdir(parents=True)
    (root / ".git" / "config").write_text("needle in git metadata\n")
    (root / ".git" / "info" / "exclude").write_text("excluded.txt\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n!keep.log\n")
    (root / "src").mkdir()
    (root / "build").mkdir()
    (root / ".hidden").mkdir()
    (root / "sub").mkdir()
    files = {
        "src/main.py": "print('needle')\nno match\n",
        "src/util.py": "def needle():\n    return 1\n",
        "debug.log": "needle in a log\n",
        "keep.log": "needle kept\n",
        "build/out.txt": "needle built\n",
        ".hidden/secret.txt": "needle hidden\n",
        ".env": "NEEDLE=1 needle\n",
        "excluded.txt": "needle excluded\n",
        "sub/.ignore": "skip-me.txt\n",
        "sub/skip-me.txt": "needle skipped by .ignore\n",
        "sub/found.md": "a needle here\n",
    }
    for index, (name, content) in enumerate(files.items()):
        path = root / name
        path.write_text(content)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    (root / "blob.bin").write_bytes(b"needle\x00\x01\x02")
    os.utime(root / "blob.bin", (1_800_000_000, 1_800_000_000))
    return root


async def test_glob_includes_hidden_and_ignored_files_but_not_vcs_metadata(tree: Path) -> None:
    """`*` lists every file at any depth, hidden and ignored ones too, oldest first, and nothing under .git."""
    text, _ = await invoke(tools_by_name(tree)["glob"], {"pattern": "*"})
    listed = text.splitlines()
    assert not any(path.startswith(".git/") for path in listed)
    assert {"debug.log", "build/out.txt", ".hidden/secret.txt", ".env", "excluded.txt"} <= set(listed)
    times = [(tree / path).stat().st_mtime for path in listed]
    assert times == sorted(times)
    assert listed[-1] == "blob.bin"


async def test_glob_patterns_with_a_slash_are_anchored_and_results_are_capped(tree: Path) -> None:
    """`src/*.py` matches only there, `*.py` matches at any depth; past the cap the result says so."""
    glob = tools_by_name(tree)["glob"]
    assert (await invoke(glob, {"pattern": "src/*.py"}))[0].splitlines() == ["src/main.py", "src/util.py"]
    assert (await invoke(glob, {"pattern": "*.py", "path": "src"}))[0].splitlines() == ["src/main.py", "src/util.py"]
    assert (await invoke(glob, {"pattern": "*.nothing"}))[0] == "No files found"
    capped, _ = await invoke(tools_by_name(tree, glob_max_results=3)["glob"], {"pattern": "*"})
    assert len(capped.split("\n\n")[0].splitlines()) == 3
    assert capped.endswith("(Showing 3 of 13 paths. Narrow pattern or path to see more.)")


def _shown(matches: list) -> list[tuple[str, int, str]]:
    return [(match.path, match.line_number, match.line) for match in matches]


_EXPECTED = [
    ("keep.log", 1, "needle kept"),
    ("src/main.py", 1, "print('needle')"),
    ("src/util.py", 1, "def needle():"),
    ("sub/found.md", 1, "a needle here"),
]


def test_python_grep_skips_hidden_ignored_and_binary_files(tree: Path) -> None:
    """The pure-Python search reads what ripgrep reads by default: no hidden, ignored or binary file."""
    workspace = Workspace(tree)
    assert _shown(python_grep(workspace, workspace.root, "needle", None)) == _EXPECTED


@needs_rg
async def test_ripgrep_and_python_give_the_same_matches(tree: Path) -> None:
    """ripgrep and the pure-Python search agree on the same tree, with and without an include glob."""
    workspace = Workspace(tree)
    binary = shutil.which("rg")
    assert binary is not None
    for include in (None, "*.py", "*.{md,log}"):
        assert _shown(await ripgrep(binary, workspace, workspace.root, "needle", include)) == _shown(
            python_grep(workspace, workspace.root, "needle", include)
        )
    assert _shown(await ripgrep(binary, workspace, workspace.root, "needle", None)) == _EXPECTED


async def test_grep_renders_matches_grouped_by_file(tree: Path) -> None:
    """The result counts the matches and lists them by file with their line numbers."""
    text, _ = await invoke(tools_by_name(tree)["grep"], {"pattern": "needle", "path": "src"})
    assert text == "Found 2 matches\n\nsrc/main.py\nLine 1: print('needle')\n\nsrc/util.py\nLine 1: def needle():"
    assert (await invoke(tools_by_name(tree)["grep"], {"pattern": "absent-word"}))[0] == "No matches found"


async def test_grep_caps_the_matches_it_shows(tmp_path: Path) -> None:
    """Past `grep_max_matches` the result shows the first matches and says how many there were."""
    (tmp_path / "many.txt").write_text("hit\n" * 10)
    text, _ = await invoke(tools_by_name(tmp_path, grep_max_matches=3)["grep"], {"pattern": "hit"})
    assert text.startswith("Found 10 matches, showing the first 3\n")
    assert text.count("Line ") == 3


def test_an_invalid_regular_expression_fails_the_search(tree: Path) -> None:
    """A pattern that does not compile is `SEARCH_FAILED`, naming the pattern."""
    workspace = Workspace(tree)
    with pytest.raises(ToolError) as raised:
        python_grep(workspace, workspace.root, "needle(", None)
    assert raised.value.code == "SEARCH_FAILED"
    assert "needle(" in raised.value.message


@needs_rg
async def test_ripgrep_reports_an_invalid_regular_expression(tree: Path) -> None:
    """ripgrep's refusal of a pattern becomes `SEARCH_FAILED` too."""
    workspace = Workspace(tree)
    binary = shutil.which("rg")
    assert binary is not None
    with pytest.raises(ToolError) as raised:
        await ripgrep(binary, workspace, workspace.root, "needle(", None)
    assert raised.value.code == "SEARCH_FAILED"
