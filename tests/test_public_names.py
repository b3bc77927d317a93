"""Public classes show the module users import them from (docs/architecture.md#public-names)."""

from __future__ import annotations

import pickle

import pytest

import dsh
import dsh.persistence
import dsh.query
import dsh.testing
from tests.helpers import exported_classes, public_module_of, public_modules


def test_every_public_class_shows_its_public_module() -> None:
    """Each class a public module exports has the shortest exporting module as `__module__`."""
    wrong = {
        f"{cls.__module__}.{cls.__qualname__}": public_module_of(cls, exporters)
        for cls, exporters in exported_classes().items()
        if cls.__module__ != public_module_of(cls, exporters)
    }
    assert wrong == {}


def test_the_public_modules_export_classes() -> None:
    """The scan sees the package: the top level, the layer packages and their classes (no empty pass)."""
    modules = public_modules()
    assert {"dsh", "dsh.session", "dsh.persistence", "dsh.query", "dsh.testing"} <= set(modules)
    assert not [name for name in modules if "._" in name]
    classes = exported_classes()
    assert dsh.Runtime in classes
    assert classes[dsh.query.SessionFilter] == ["dsh.query", "dsh.query.records"]


@pytest.mark.parametrize(
    ("cls", "shown"),
    [
        (dsh.Runtime, "<class 'dsh.Runtime'>"),
        (dsh.SessionHeader, "<class 'dsh.SessionHeader'>"),
        (dsh.DshError, "<class 'dsh.DshError'>"),
        (dsh.query.SessionFilter, "<class 'dsh.query.SessionFilter'>"),
        (dsh.persistence.StoredSessionInfo, "<class 'dsh.persistence.StoredSessionInfo'>"),
        (dsh.testing.FaultyBackend, "<class 'dsh.testing.FaultyBackend'>"),
    ],
)
def test_a_public_class_repr_names_its_public_module(cls: type, shown: str) -> None:
    """`repr(dsh.Runtime)` is `<class 'dsh.Runtime'>`, and a sub-package's name shows that package."""
    assert repr(cls) == shown


def test_a_public_error_and_enum_pickle_through_their_public_module() -> None:
    """Pickle finds an error class and an enum member by their public names and gets the same objects back."""
    error = dsh.ConfigError("bad value")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is dsh.ConfigError
    assert str(copy) == "bad value"
    member = dsh.persistence.Capability.LEASES
    assert pickle.loads(pickle.dumps(member)) is member
