"""pydsh writes, the harness reads: its `list`, `inspect`, `load`, `listChildren` and `listDescendants`
see exactly what pydsh sees, for every kind of log pydsh writes.

The homes come from `tests/interop/homes.py`: sessions written through the library API, sessions the
agent loop wrote on the scripted model (with and without logged chunks; one-shot and continuable
children two levels deep, a follow-up, a `fork`-provider child, a plain fork, a cancelled turn), a
harness session pydsh resumed, and the demo's home. Each is read by both sides and the views must be
equal (docs/storage-format.md#compatibility-with-the-typescript-harness).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from dsh.demo.scenario import run_demo
from dsh.session.events import KNOWN_EVENT_TYPES
from tests.helpers import tree_snapshot
from tests.interop.compare import StoreView, harness_view, pydsh_view
from tests.interop.harness import HarnessProcess, upstream_sources
from tests.interop.homes import Home, agent_home, library_home, resume_in_pydsh
from tests.interop.streams import chunk_batches, harness_turn

pytestmark = [pytest.mark.interop, pytest.mark.slow]

_TOKEN_USAGE_KEYS = {"inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens"}


def _both(harness: HarnessProcess, home: Home, *, compression: str = "zstd") -> tuple[StoreView, StoreView]:
    """The home's store as pydsh and as the harness see it, catalogs of every session and trees of the roots."""
    ours = asyncio.run(pydsh_view(home.sessions))
    ids = sorted(ours.logs)
    ours = asyncio.run(pydsh_view(home.sessions, catalogs=ids, descendants=home.roots))
    theirs = harness_view(harness, home.sessions, catalogs=ids, descendants=home.roots, compression=compression)
    return ours, theirs


def _assert_same(ours: StoreView, theirs: StoreView) -> None:
    assert sorted(theirs.logs) == sorted(ours.logs)
    for session_id, log in ours.logs.items():
        assert log.refused is None, f"pydsh refused its own log {session_id}: {log.refused}"
        assert theirs.logs[session_id] == log, f"the harness reads {session_id} differently"
    assert theirs.headers == ours.headers
    assert theirs.children == ours.children
    assert theirs.descendants == ours.descendants


def _harness_vocabulary() -> set[str]:
    """The event types the pinned harness knows (`known-event-types.ts`)."""
    source = upstream_sources() / "packages" / "core" / "session" / "src" / "known-event-types.ts"
    # (every caller holds the `upstream` or `harness` fixture, which skips or fails without the sources)
    return set(re.findall(r"^\s+'([^']+)',$", source.read_text(), re.MULTILINE))


def _assert_harness_shapes(view: StoreView) -> None:
    """Every event is of the harness's vocabulary (or ignorable); usage only on steps, in its shape."""
    known = _harness_vocabulary()
    assert len(known) > 40
    for log in view.logs.values():
        for event in log.events or ():
            assert event["type"] in known or event.get("ignorable") is True, event
            data = event["data"]
            if event["type"] == "turn/end":
                assert set(data) == {"turn", "reason"}, event
            if event["type"] == "assistant/message" and "usage" in data:
                assert set(data["usage"]) <= _TOKEN_USAGE_KEYS, event
            if event["type"] == "assistant/chunk" and data["chunk"]["type"] == "usage":
                assert set(data["chunk"]["usage"]) <= _TOKEN_USAGE_KEYS, event


def test_the_event_types_pydsh_knows_are_the_harness_vocabulary(upstream: Path) -> None:
    """pydsh's `KNOWN_EVENT_TYPES` is exactly the pinned harness's `KNOWN_SESSION_EVENT_TYPES`, so a type
    pydsh writes without `ignorable` is one the harness reads."""
    assert set(KNOWN_EVENT_TYPES) == _harness_vocabulary()


@pytest.fixture(scope="module", params=[False, True], ids=["chunks-not-logged", "chunks-logged"])
def agent_logs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Home:
    """A home the agent loop wrote, with or without `assistant/chunk` events."""
    return asyncio.run(agent_home(tmp_path_factory.mktemp("agent") / "home", log_chunks=request.param))


def test_agent_loop_logs_read_in_the_harness_as_in_pydsh(harness: HarnessProcess, agent_logs: Home) -> None:
    """Every log the agent loop wrote (subagents two levels deep, forks, a cancelled turn) reads in the
    harness as in pydsh, and its catalog and descendant tree list the same rows."""
    ours, theirs = _both(harness, agent_logs)
    _assert_same(ours, theirs)
    parent = agent_logs.roots[0]
    assert [row["label"] for row in ours.children[parent]] == ["One-shot helper", "Background helper", "Forked helper"]
    assert [(entry["label"], entry["depth"]) for entry in ours.descendants[parent]] == [
        ("One-shot helper", 1),
        ("One-shot grandchild", 2),
        ("Background helper", 1),
        ("Background grandchild", 2),
        ("Forked helper", 1),
    ]
    interrupted = [
        event
        for event in ours.logs[parent].events or ()
        if event["type"] == "assistant/message" and event["data"].get("interrupted") is True
    ]
    assert len(interrupted) == 1
    _assert_harness_shapes(ours)


def test_the_harness_load_of_closed_pydsh_logs_changes_nothing(harness: HarnessProcess, agent_logs: Home) -> None:
    """`load` (which commits repairs) finds nothing to repair in a closed pydsh log and writes nothing."""
    before = tree_snapshot(agent_logs.sessions)
    for session_id in asyncio.run(pydsh_view(agent_logs.sessions)).logs:
        harness.call("load", root=agent_logs.sessions, session=session_id)
    assert tree_snapshot(agent_logs.sessions) == before


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_library_sessions_read_in_the_harness_as_in_pydsh(
    harness: HarnessProcess, tmp_path: Path, compression: str
) -> None:
    """Sessions written through the library API (every message kind, children of each mode, a fork, escaped
    ids), compressed or not, read and list in the harness as in pydsh."""
    home = asyncio.run(library_home(tmp_path / "home", compression=compression))
    ours, theirs = _both(harness, home, compression=compression)
    _assert_same(ours, theirs)
    assert [row["id"] for row in ours.children["lib-parent"]] == ["lib-child/one", "lib-child~two", "lib-child-three"]
    _assert_harness_shapes(ours)


def test_a_harness_session_pydsh_resumed_reads_in_the_harness(harness: HarnessProcess, tmp_path: Path) -> None:
    """A session the harness wrote (packed chunk rows), resumed by a pydsh agent for one more turn, still reads
    in the harness as in pydsh: pydsh appends after the packed rows in current shapes."""
    home = tmp_path / "home"
    batches = [*chunk_batches(1, ["Hel", "lo", " there", "!"]), *harness_turn(2, "Go on.", "Sure.")]
    harness.call(
        "write", root=home / "sessions", sessions=[{"id": "h1", "meta": {"cwd": "/srv/h"}, "batches": batches}]
    )
    assert asyncio.run(resume_in_pydsh(home, "h1", "And now?")) == "RESUMED_OK"
    ours, theirs = _both(harness, Home(home, ("h1",)))
    _assert_same(ours, theirs)
    types = [event["type"] for event in ours.logs["h1"].events or ()]
    assert types.count("turn/start") == 3
    _assert_harness_shapes(ours)


def test_the_demo_home_reads_in_the_harness_as_in_pydsh(harness: HarnessProcess, tmp_path: Path) -> None:
    """The demo's home (parents, children of both modes, a restart, a child whose descriptor was removed)
    reads in the harness as in pydsh, the damaged child a `corrupt` diagnostic row on both sides."""
    home = tmp_path / "home"
    home.mkdir()
    result = asyncio.run(run_demo(home, _Quiet()))
    assert result.damage is not None
    ours, theirs = _both(harness, Home(home, (result.parent,)))
    _assert_same(ours, theirs)
    assert {"kind": "diagnostic", "id": result.damage.session_id, "reason": "corrupt"} in ours.children[result.parent]
    _assert_harness_shapes(ours)


class _Quiet:
    """A demo reporter that keeps nothing."""

    def phase(self, title: str) -> None:
        """Nothing."""

    def info(self, text: str) -> None:
        """Nothing."""

    def catalog(self, view: Any) -> None:
        """Nothing."""

    def busy(self, label: str) -> Any:
        """No spinner."""
        import contextlib

        return contextlib.nullcontext()
