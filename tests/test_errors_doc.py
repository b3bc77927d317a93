"""docs/errors.md lists every code a class can carry, and marks reserved exactly the codes none carries.

The code table of the page names each code once, with the class that carries it. A code that no
class can carry yet (nothing raises it) is kept under its final name and marked **reserved** there
and in the page's reserved list (docs/errors.md#reserved-codes).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import dsh
from dsh.errors import DshError

_PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
_ROW = re.compile(r"^\| `(?P<code>[A-Z][A-Z0-9_]+)` \| (?P<classes>[^|]+) \|(?P<rest>.*)$", re.MULTILINE)


def _carried() -> set[str]:
    """Every code some `DshError` subclass can carry, with every `dsh` module imported."""
    for module in pkgutil.walk_packages(dsh.__path__, "dsh."):
        importlib.import_module(module.name)
    codes: set[str] = set()
    stack: list[type[DshError]] = [DshError]
    while stack:
        cls = stack.pop()
        codes |= cls.codes
        stack.extend(cls.__subclasses__())
    return codes


def _section(title: str) -> str:
    text = _PAGE.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _rows() -> list[re.Match[str]]:
    return list(_ROW.finditer(_section("Codes")))


def test_the_code_table_lists_each_code_once() -> None:
    """No code has two rows in the table of docs/errors.md."""
    codes = [row["code"] for row in _rows()]
    assert codes
    assert sorted({code for code in codes if codes.count(code) > 1}) == []


def test_the_code_table_holds_every_carried_code_and_only_reserved_others() -> None:
    """Every carried code has an unmarked row; every other row is marked reserved."""
    carried = _carried()
    rows = {row["code"]: "**reserved**" in row["rest"] for row in _rows()}
    assert carried - rows.keys() == set()
    assert sorted(code for code, reserved in rows.items() if reserved and code in carried) == []
    assert sorted(code for code, reserved in rows.items() if not reserved and code not in carried) == []


def test_the_reserved_list_matches_the_marked_rows() -> None:
    """The reserved-codes section names exactly the codes the table marks reserved."""
    marked = {row["code"] for row in _rows() if "**reserved**" in row["rest"]}
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", _section("Reserved codes")))
    assert marked
    assert listed == marked


def test_each_row_names_a_class_that_exists() -> None:
    """The class column of every row names `DshError` subclasses, so a code is never documented on a ghost."""
    _carried()
    names: set[str] = set()
    stack: list[type[DshError]] = [DshError]
    while stack:
        cls = stack.pop()
        names.add(cls.__name__)
        stack.extend(cls.__subclasses__())
    unknown = sorted(
        f"{row['code']}: {name}"
        for row in _rows()
        for name in re.findall(r"`([A-Z][A-Za-z]+)`", row["classes"])
        if name not in names
    )
    assert unknown == []
