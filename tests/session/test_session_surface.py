"""Surface folding: appends, and replaces checked both in restored seeds and at `append`.

A seed that breaks a replace rule is refused outright; `append` checks the same rules up front, so a bad
replace never reaches the log. The surface is described in docs/glossary.md#surface.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsh.session import Session, SessionError, SessionStore, SurfaceReplace
from tests.session.helpers import assistant_message, record, tool_call, tool_result, user_message

_MISSING_TEXT = "surface replace: sourceEventSeqs must include every shadowed surface node; missing 1, 2"
_CONTENT_ONLY = "surface replace: a tool/result replace may change only content of its tool-result block"


def _replace(start: int, end: int) -> dict[str, Any]:
    return {"op": "replace", "start": start, "end": end}


def _three_users() -> list[dict[str, Any]]:
    return [record(i, "user/message", user_message(f"u{i}"), surfaceOp="append") for i in range(3)]


def _tool_log() -> list[dict[str, Any]]:
    """A turn whose step called tool c1 and got a result at seq 5."""
    return [
        record(0, "turn/start", {"turn": 1}),
        record(1, "step/start", {"turn": 1, "step": 1}),
        record(2, "assistant/message", assistant_message(1, 1, tool_calls=["c1"]), surfaceOp="append"),
        record(3, "tool/call", tool_call(1, 1, "c1")),
        record(4, "user/message", user_message("u-mid"), surfaceOp="append"),
        record(5, "tool/result", tool_result(1, 1, "c1", is_error=False, text="first"), surfaceOp="append"),
    ]


def _seed_error(store: SessionStore, seed: list[dict[str, Any]]) -> SessionError:
    with pytest.raises(SessionError) as caught:
        store.prepare("seeded", seed=seed)
    assert caught.value.code == "INVALID_SEED"
    assert store.get("seeded") is None
    return caught.value


def _append_refused(session: Session, *args: Any, **kwargs: Any) -> SessionError:
    nodes, generation, seq = session.surface.nodes, session.surface.replace_generation, session.seq
    with pytest.raises(SessionError) as caught:
        session.append(*args, **kwargs)
    assert caught.value.code == "INVALID_EVENT"
    assert (session.surface.nodes, session.surface.replace_generation, session.seq) == (nodes, generation, seq)
    return caught.value


def test_seed_replace_missing_shadowed_nodes_is_refused(store: SessionStore) -> None:
    """A seed replace that cites only some shadowed nodes fails with the "missing a, b" text."""
    seed = [
        *_three_users(),
        record(3, "user/message", user_message("r"), surfaceOp=_replace(0, 2), sourceEventSeqs=[0]),
    ]
    error = _seed_error(store, seed)
    assert error.message == f"invalid seed event at index 3: {_MISSING_TEXT}"


def test_append_replace_missing_shadowed_nodes_is_refused(store: SessionStore) -> None:
    """The same replace through append fails with the same text and leaves surface and log alone."""
    session = store.create()
    for i in range(3):
        session.append("user/message", user_message(f"u{i}"))
    error = _append_refused(
        session, "user/message", user_message("r"), surface_op=SurfaceReplace(0, 2), source_event_seqs=[0]
    )
    assert error.message == _MISSING_TEXT
    assert session.surface.nodes == (0, 1, 2)


def test_replace_citing_every_shadowed_node_splices_the_range(store: SessionStore) -> None:
    """A replace citing every shadowed node takes their place and bumps replace_generation, from seed or append."""
    seed = [
        *_three_users(),
        record(3, "user/message", user_message("r"), surfaceOp=_replace(1, 2), sourceEventSeqs=[1, 2]),
    ]
    seeded = store.prepare("seeded", seed=seed)
    assert seeded.surface.nodes == (0, 3)
    assert seeded.surface.replace_generation == 1
    live = store.create()
    for i in range(3):
        live.append("user/message", user_message(f"u{i}"))
    event = live.append("user/message", user_message("r"), surface_op=SurfaceReplace(0, 1), source_event_seqs=[0, 1])
    assert event["surfaceOp"] == {"op": "replace", "start": 0, "end": 1}
    assert event.surface_op == SurfaceReplace(0, 1)
    assert live.surface.nodes == (3, 2)
    assert live.surface.replace_generation == 1
    assert [message["id"] for message in live.derive_messages()] == ["r", "u2"]


@pytest.mark.parametrize(("start", "end"), [(5, 5), (2, 0), (0, 9)])
def test_replace_must_name_current_nodes_in_order(store: SessionStore, start: int, end: int) -> None:
    """A replace whose start/end are not current surface nodes in order is refused."""
    session = store.create()
    for i in range(3):
        session.append("user/message", user_message(f"u{i}"))
    error = _append_refused(
        session, "user/message", user_message("r"), surface_op=SurfaceReplace(start, end), source_event_seqs=[0, 1, 2]
    )
    assert "must name current surface nodes" in error.message


def test_shadowed_nodes_cannot_be_replaced_again(store: SessionStore) -> None:
    """After a replace, the shadowed seqs are no longer surface nodes."""
    session = store.create()
    session.append("user/message", user_message("u0"))
    session.append("user/message", user_message("r"), surface_op=SurfaceReplace(0, 0), source_event_seqs=[0])
    _append_refused(session, "user/message", user_message("r2"), surface_op=SurfaceReplace(0, 0), source_event_seqs=[0])


def _changed_result(**changes: Any) -> dict[str, Any]:
    data = tool_result(1, 1, "c1", is_error=False, text="first")
    block = data["message"]["content"][0]
    block.update(changes)
    return data


def test_tool_result_replace_changing_is_error_is_refused_from_seed(store: SessionStore) -> None:
    """A restored tool/result replace that changes isError is rejected as "may change only content"."""
    seed = [
        *_tool_log(),
        record(6, "tool/result", _changed_result(isError=True), surfaceOp=_replace(5, 5), sourceEventSeqs=[5]),
    ]
    assert _seed_error(store, seed).message == f"invalid seed event at index 6: {_CONTENT_ONLY}"


def test_tool_result_replace_changing_is_error_is_refused_at_append(store: SessionStore) -> None:
    """The same tool/result replace through append is INVALID_EVENT with the same text."""
    session = store.create("live", seed=_tool_log())
    error = _append_refused(
        session, "tool/result", _changed_result(isError=True), surface_op=SurfaceReplace(5, 5), source_event_seqs=[5]
    )
    assert error.message == _CONTENT_ONLY


@pytest.mark.parametrize(
    "mutate",
    [
        lambda data: data["message"].update(id="other"),
        lambda data: data["message"]["source"].update(extra=1),
        lambda data: data["message"]["content"][0].update(extra=True),
    ],
)
def test_tool_result_replace_may_change_only_inner_content(store: SessionStore, mutate: Any) -> None:
    """Changing the message id, its source or another block field is refused."""
    session = store.create("live", seed=_tool_log())
    data = _changed_result()
    mutate(data)
    error = _append_refused(session, "tool/result", data, surface_op=SurfaceReplace(5, 5), source_event_seqs=[5])
    assert error.message == _CONTENT_ONLY


def test_tool_result_replace_of_content_succeeds(store: SessionStore) -> None:
    """Changing only the inner content succeeds from a seed and through append, bumping replace_generation."""
    new_content = [{"type": "text", "text": "pruned"}]
    seed = [
        *_tool_log(),
        record(6, "tool/result", _changed_result(content=new_content), surfaceOp=_replace(5, 5), sourceEventSeqs=[5]),
    ]
    seeded = store.prepare("seeded", seed=seed)
    assert seeded.surface.nodes == (2, 4, 6)
    assert seeded.surface.replace_generation == 1
    live = store.create("live", seed=_tool_log())
    assert live.surface.replace_generation == 0
    live.append(
        "tool/result", _changed_result(content=new_content), surface_op=SurfaceReplace(5, 5), source_event_seqs=[5]
    )
    assert live.surface.nodes == (2, 4, 7)
    assert live.surface.replace_generation == 1


def test_tool_result_replace_must_shadow_exactly_one_tool_result(store: SessionStore) -> None:
    """A tool/result replace over a user message, or over two nodes, is refused."""
    session = store.create("live", seed=_tool_log())
    error = _append_refused(
        session, "tool/result", _changed_result(), surface_op=SurfaceReplace(4, 5), source_event_seqs=[4, 5]
    )
    assert "exactly one tool/result node" in error.message
    error = _append_refused(
        session, "tool/result", _changed_result(), surface_op=SurfaceReplace(4, 4), source_event_seqs=[4]
    )
    assert "exactly one tool/result node" in error.message


def test_failed_seed_surface_builds_nothing(store: SessionStore) -> None:
    """A failing seed leaves nothing half-built: the id stays free for a valid prepare."""
    seed = [
        *_three_users(),
        record(3, "user/message", user_message("r"), surfaceOp=_replace(0, 2), sourceEventSeqs=[0]),
    ]
    _seed_error(store, seed)
    assert store.create("seeded", seed=_three_users()).surface.nodes == (0, 1, 2)


def test_surface_view_is_read_only(store: SessionStore) -> None:
    """The surface view exposes a tuple of nodes and cannot be used to change the surface."""
    session = store.create()
    session.append("user/message", user_message())
    view = session.surface
    assert type(view.nodes) is tuple
    with pytest.raises(AttributeError):
        view.nodes = (9,)  # type: ignore[misc]
