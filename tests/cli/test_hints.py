"""The hints the CLI prints to run another command repeat the root options, never a password."""

from __future__ import annotations

from pathlib import Path

from dsh.cli.agents import unlisted_line
from dsh.cli.app import Globals


def test_a_hint_repeats_the_root_options_shell_quoted() -> None:
    """`--home` and `--database-url` come first, quoted so the hint can be pasted into a shell."""
    words = Globals(home=Path("/tmp/my home"), database_url="sqlite:///tmp/x y.db").command_words()
    assert words == ["dsh", "--home", "'/tmp/my home'", "--database-url", "'sqlite:///tmp/x y.db'"]


def test_a_hint_masks_the_database_password() -> None:
    """A password in the database URL (user part or parameter) never reaches the printed hint."""
    line = unlisted_line(2, Globals(database_url="postgresql://app:s3cret@db:5432/dsh?password=s3cret"))
    assert "s3cret" not in line
    assert line == (
        "2 stored sessions could not be read; run dsh --database-url "
        "'postgresql://app:***@db:5432/dsh?password=***' doctor"
    )
