"""The README's Python code blocks run as tests (executable documentation)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_readme_has_quick_start() -> None:
    """The README shows both make targets and at least one Python quick start block."""
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text
    assert "make test" in text
    assert _python_blocks()


def test_readme_python_blocks_run() -> None:
    """Every Python block of the README executes without error."""
    for block in _python_blocks():
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
