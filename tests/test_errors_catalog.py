"""The error catalog in `dsh.errors` lists every code exactly once, and every class uses listed codes."""

from __future__ import annotations

import importlib
import pkgutil
import re

import dsh
from dsh.errors import DshError


def _import_all() -> None:
    for module in pkgutil.walk_packages(dsh.__path__, "dsh."):
        importlib.import_module(module.name)


def _subclasses(cls: type[DshError]) -> list[type[DshError]]:
    out: list[type[DshError]] = []
    stack = [cls]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(current.__subclasses__())
    return out


def _table() -> list[str]:
    doc = importlib.import_module("dsh.errors").__doc__ or ""
    section = doc.split("Codes (", 1)[1]
    return re.findall(r"^    ([A-Z][A-Z0-9_]+)\s+\S", section, flags=re.MULTILINE)


def test_catalog_lists_each_code_once() -> None:
    """No code appears twice in the table, so no code can name two failure kinds."""
    codes = _table()
    assert codes, "the code table is empty"
    duplicates = {code for code in codes if codes.count(code) > 1}
    assert not duplicates


def test_catalog_matches_the_codes_classes_carry() -> None:
    """Every code a DshError subclass can carry is in the table, and the table lists nothing else."""
    _import_all()
    carried: set[str] = set()
    for cls in _subclasses(DshError):
        carried |= set(cls.codes)
    assert carried == set(_table())


def test_every_concrete_error_has_a_code() -> None:
    """Every DshError subclass declares at least one code, except family bases that have subclasses."""
    _import_all()
    missing = [
        cls.__qualname__
        for cls in _subclasses(DshError)
        if cls is not DshError and not cls.codes and not cls.__subclasses__()
    ]
    assert not missing


def test_class_tree_names_every_class() -> None:
    """The class tree in the docstring names every DshError subclass."""
    _import_all()
    doc = importlib.import_module("dsh.errors").__doc__ or ""
    tree = doc.split("Codes (", 1)[0]
    missing = [cls.__name__ for cls in _subclasses(DshError) if cls.__name__ not in tree]
    assert not missing
