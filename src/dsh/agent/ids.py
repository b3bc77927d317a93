"""Id factories: one stream per kind of id (sessions, messages, calls, runs).

Layer: agent. The runtime takes an `IdFactory` so that a demo or a snapshot test can make every id
deterministic while production uses random ones. Each kind has its own stream, so adding a message
never shifts the next session id — which is what keeps golden files stable when a script changes.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Final, Literal, Protocol, runtime_checkable

from dsh.session.ids import new_session_id

__all__ = ["IdFactory", "IdKind", "RandomIds", "SequentialIds"]

IdKind = Literal["session", "message", "call", "run"]

_KIND_NUMBER: Final[dict[IdKind, int]] = {"session": 1, "message": 2, "call": 3, "run": 4}


@runtime_checkable
class IdFactory(Protocol):
    """Mints ids, one stream per kind."""

    def session(self) -> str:
        """A new session (and agent) id."""

    def message(self) -> str:
        """A new message id (user, assistant and tool-result messages)."""

    def call(self) -> str:
        """A new tool-call id, for a model that did not name its call."""

    def run(self) -> str:
        """A new subagent run id."""


class RandomIds:
    """Production ids: ULIDs for sessions, random UUIDs for the rest."""

    def session(self) -> str:
        """A new ULID."""
        return new_session_id()

    def message(self) -> str:
        """A new random UUID."""
        return str(uuid.uuid4())

    def call(self) -> str:
        """`call_` and 24 random hex digits."""
        return f"call_{uuid.uuid4().hex[:24]}"

    def run(self) -> str:
        """A new random UUID."""
        return str(uuid.uuid4())


class SequentialIds:
    """Deterministic UUID-shaped ids: `0000000K-0000-4000-8000-00000000000N` (K = kind, N = counter).

    Kinds: 1 sessions, 2 messages, 3 calls, 4 runs; each counter starts at 1. Pass the same instance
    to two runtimes to continue the streams across a restart.
    """

    def __init__(self) -> None:
        self._counters: dict[IdKind, Iterator[int]] = {kind: itertools.count(1) for kind in _KIND_NUMBER}

    def _next(self, kind: IdKind) -> str:
        return f"{_KIND_NUMBER[kind]:08d}-0000-4000-8000-{next(self._counters[kind]):012d}"

    def session(self) -> str:
        """The next session id."""
        return self._next("session")

    def message(self) -> str:
        """The next message id."""
        return self._next("message")

    def call(self) -> str:
        """The next call id."""
        return self._next("call")

    def run(self) -> str:
        """The next run id."""
        return self._next("run")
