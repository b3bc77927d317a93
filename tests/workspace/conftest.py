"""Fixtures of the workspace-tool, approval and instruction tests.

Every event any session store appends while one of these tests runs is checked, at the end of the
test, against the TypeScript harness's event shapes (`dsh.testing.event_shapes`): each must be of a
type its vocabulary knows, with the data it declares, or carry the `ignorable` marker. Tests that run
`dsh` in another process check the logs they stored themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dsh.session.store import SessionStore
from dsh.testing.event_shapes import assert_harness_shapes


@pytest.fixture(autouse=True)
def _events_follow_the_harness_shapes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Collect every appended event of every store made during the test; check their shapes afterwards."""
    written: list[Any] = []
    original = SessionStore.__init__

    def collecting(self: SessionStore, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.on_event(lambda session, event: written.append(event))

    monkeypatch.setattr(SessionStore, "__init__", collecting)
    yield written
    assert_harness_shapes(written)
