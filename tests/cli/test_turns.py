"""The pieces of `dsh.cli.turns`: how a tool call is named on one line, and `dsh chat` off a terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.cli.turns import key_argument, one_line

runner = CliRunner()


@pytest.mark.parametrize(
    ("name", "arguments", "shown"),
    [
        ("bash", '{"command": "pytest -q", "description": "Run the tests"}', "pytest -q"),
        ("read", {"file_path": "src/a.py", "offset": 3}, "src/a.py"),
        ("grep", {"include": "*.py", "pattern": "TODO"}, "TODO"),
        ("agent", {"prompt": "Check it.", "description": "Checker"}, "Checker"),
        ("my_tool", {"count": 3, "city": "Paris"}, "Paris"),
        ("my_tool", "{not json", "{not json"),
        ("my_tool", "", ""),
    ],
)
def test_a_call_is_shown_by_its_key_argument(name: str, arguments: object, shown: str) -> None:
    """The key argument of the known tools, else the first string argument; raw text that is not JSON as it is."""
    assert key_argument(name, arguments) == shown


def test_one_line_folds_whitespace_escapes_controls_and_cuts_with_an_ellipsis() -> None:
    """Newlines and runs of spaces become one space, ESC is escaped, and a long line ends in `…` at the width."""
    assert one_line("a\n  b\tc", 80) == "a b c"
    assert one_line("x\x1b[2Jy", 80) == "x\\x1b[2Jy"
    cut = one_line("word " * 40, 20)
    assert len(cut) == 20
    assert cut.endswith("…")


def test_chat_off_a_terminal_points_to_dsh_run(tmp_path: Path) -> None:
    """`dsh chat` with stdin and stdout not a terminal exits 2 and names `dsh run` for scripts."""
    result = runner.invoke(app, ["--home", str(tmp_path), "chat"])
    assert result.exit_code == 2
    assert "dsh chat needs a terminal" in result.stderr
    assert "dsh run" in result.stderr
    assert not (tmp_path / "sessions").exists()
