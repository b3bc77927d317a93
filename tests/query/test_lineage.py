"""`trace_session`: ancestors, completeness, cycles and the descendant forest.

See docs/query.md#lineage.
"""

from __future__ import annotations

import sys

import pytest

from dsh.abort import AbortSignal
from dsh.query import LineageNode, SessionQuery, SessionQueryError, SessionRecord
from dsh.session import HeaderInit, SessionHeader, SessionId, SessionStore
from tests.query.helpers import FakePersistence, closed_log, stored_header


def ids(records: tuple[SessionRecord, ...]) -> list[str]:
    """Ids of records, in order."""
    return [record.header.id for record in records]


def tree(nodes: tuple[LineageNode, ...]) -> list[object]:
    """A nested `[id, [children...]]` picture of a (shallow) lineage forest."""
    return [[node.record.header.id, tree(node.children)] for node in nodes]


def chain(store: SessionStore, *session_ids: str) -> None:
    """Create live sessions, each the child of the previous one."""
    parent: str | None = None
    for session_id in session_ids:
        store.create(session_id, header=HeaderInit(parent_session=parent))
        parent = session_id


async def test_ancestors_lead_to_the_root_after_one_listing(store: SessionStore) -> None:
    """root -> a -> b: ancestors [a, root], complete, root is root, persistence listed exactly once."""
    chain(store, "root", "a", "b")
    persistence = FakePersistence()
    lineage = await SessionQuery(store, persistence).trace_session(SessionId("b"))
    assert ids(lineage.ancestors) == ["a", "root"]
    assert lineage.complete is True
    assert lineage.root is not None
    assert lineage.root.header.id == "root"
    assert lineage.unresolved_parent_id is None
    assert lineage.target.header.id == "b"
    assert lineage.descendants == ()
    assert persistence.calls == {"list": 1}


async def test_parentless_target_is_its_own_root(store: SessionStore) -> None:
    """A target without parentSession is complete with itself as root."""
    chain(store, "root", "a")
    lineage = await SessionQuery(store).trace_session(SessionId("root"))
    assert lineage.ancestors == ()
    assert lineage.complete is True
    assert lineage.root is lineage.target
    assert tree(lineage.descendants) == [["a", []]]


async def test_missing_parent_is_incomplete(store: SessionStore) -> None:
    """A parent id absent from the corpus ends the walk with complete=False and that id."""
    store.create("a", header=HeaderInit(parent_session="gone"))
    store.create("b", header=HeaderInit(parent_session="a"))
    lineage = await SessionQuery(store).trace_session(SessionId("b"))
    assert ids(lineage.ancestors) == ["a"]
    assert lineage.complete is False
    assert lineage.root is None
    assert lineage.unresolved_parent_id == "gone"


async def test_persisted_only_ancestors_count(store: SessionStore) -> None:
    """Ancestors may be persisted-only records of the corpus."""
    store.create("b", header=HeaderInit(parent_session="a"))
    persistence = FakePersistence(
        rows=[stored_header(id="a", createdAt=1, parentSession="root"), stored_header(id="root")]
    )
    lineage = await SessionQuery(store, persistence).trace_session(SessionId("b"))
    assert ids(lineage.ancestors) == ["a", "root"]
    assert [(r.live, r.persisted) for r in lineage.ancestors] == [(False, True), (False, True)]
    assert lineage.complete is True


@pytest.mark.parametrize("target", ["x", "y"])
async def test_a_cycle_is_invalid_lineage(store: SessionStore, target: str) -> None:
    """A cycle in parentSession links is INVALID_LINEAGE with the exact message."""
    rows = [stored_header(id="x", parentSession="y"), stored_header(id="y", parentSession="x")]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(rows=rows)).trace_session(SessionId(target))
    assert caught.value.code == "SESSION_QUERY_INVALID_LINEAGE"
    assert str(caught.value) == f'session lineage contains a cycle at "{target}"'


async def test_a_cycle_above_the_target_names_the_repeated_id(store: SessionStore) -> None:
    """A repeated id above the target is a cycle at that id."""
    rows = [
        stored_header(id="t", parentSession="p"),
        stored_header(id="p", parentSession="q"),
        stored_header(id="q", parentSession="p"),
    ]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(rows=rows)).trace_session(SessionId("t"))
    assert str(caught.value) == 'session lineage contains a cycle at "p"'


async def test_self_parent_is_a_cycle(store: SessionStore) -> None:
    """A session naming itself as parent repeats the target id."""
    rows = [stored_header(id="me", parentSession="me")]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(rows=rows)).trace_session(SessionId("me"))
    assert str(caught.value) == 'session lineage contains a cycle at "me"'


async def test_descendants_are_ordered_by_created_at_then_id(store: SessionStore) -> None:
    """Descendants over every origin are ordered by createdAt ascending, then id."""
    store.create("root", header=HeaderInit(created_at=1))
    for session_id, created_at, parent, origin in (
        ("c3", 9, "root", None),
        ("c2", 5, "root", "subagent"),
        ("c1", 5, "root", None),
        ("g1", 20, "c2", "subagent"),
        ("g0", 10, "c2", None),
        ("other", 2, "elsewhere", None),
    ):
        store.create(session_id, header=HeaderInit(created_at=created_at, parent_session=parent, origin=origin))
    persistence = FakePersistence(rows=[stored_header(id="c0", createdAt=5, parentSession="root")])
    lineage = await SessionQuery(store, persistence).trace_session(SessionId("root"))
    assert tree(lineage.descendants) == [
        ["c0", []],
        ["c1", []],
        ["c2", [["g0", []], ["g1", []]]],
        ["c3", []],
    ]


async def test_fork_children_are_descendants(store: SessionStore) -> None:
    """Fork children (not subagents) appear among the descendants."""
    parent = store.create("p")
    closed_log(parent)
    store.fork(parent, child_id="f")
    lineage = await SessionQuery(store).trace_session(SessionId("p"))
    assert tree(lineage.descendants) == [["f", []]]


async def test_an_unknown_target_is_not_found(store: SessionStore) -> None:
    """An id absent from the corpus is SESSION_NOT_FOUND."""
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store).trace_session(SessionId("ghost"))
    assert caught.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    assert str(caught.value) == 'session "ghost" not found'


async def test_listing_errors_propagate(store: SessionStore) -> None:
    """Trace fails with the listing's errors (persistence failure, abort)."""
    query = SessionQuery(store, FakePersistence(list_error=OSError("down")))
    with pytest.raises(SessionQueryError) as caught:
        await query.trace_session(SessionId("x"))
    assert caught.value.code == "SESSION_QUERY_PERSISTENCE_FAILED"
    with pytest.raises(SessionQueryError) as aborted:
        await query.trace_session(SessionId("x"), AbortSignal.aborted_with("stop"))
    assert aborted.value.code == "SESSION_QUERY_ABORTED"


@pytest.mark.slow
async def test_a_ten_thousand_deep_chain_traces_without_recursion_error(store: SessionStore) -> None:
    """A 10,000-deep chain traces both ways without RecursionError (the default limit is 1,000)."""
    depth = 10_000
    rows = [
        SessionHeader(
            version=0,
            id=SessionId(f"n{i:05d}"),
            created_at=i,
            parent_session=SessionId(f"n{i - 1:05d}") if i else None,
        )
        for i in range(depth)
    ]
    query = SessionQuery(store, FakePersistence(rows=rows))
    assert sys.getrecursionlimit() < depth
    leaf = await query.trace_session(SessionId(f"n{depth - 1:05d}"))
    top = await query.trace_session(SessionId("n00000"))
    assert len(leaf.ancestors) == depth - 1
    assert leaf.complete
    assert leaf.root is not None
    assert leaf.root.header.id == "n00000"
    node_count = 0
    level = top.descendants
    while level:
        (node,) = level
        node_count += 1
        level = node.children
    assert node_count == depth - 1
    assert repr(top.descendants[0]) == "LineageNode(id='n00001', children=1)"
