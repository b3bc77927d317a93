"""`dsh demo`: a keyless walkthrough of the session core.

Creates a session, records one turn, forks it, and shows what the child inherited: the logical
header says only `isSeeded`, the exact cut travels beside it, and `is_own_seq` separates the
inherited prefix from the child's own events.
"""

from __future__ import annotations

from collections.abc import Callable

from dsh.session import SessionStore

USER_MESSAGE = {
    "id": "m1",
    "role": "user",
    "content": [{"type": "text", "text": "Summarize the teapot notes."}],
    "source": {"kind": "user"},
}


def run_demo(echo: Callable[[str], None]) -> int:
    """Print the walkthrough through `echo`; returns the exit code."""
    store = SessionStore()
    parent = store.create()
    parent.append("turn/start", {"turn": 1})
    parent.append("user/message", USER_MESSAGE)
    parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    echo("== parent session ==")
    echo(f"id {parent.id}  events {parent.seq}  header {parent.header.to_json()}")
    for event in parent.events:
        echo(f"  seq {event.seq:>2}  {event.type}")

    child = store.fork(parent)
    child.append("turn/start", {"turn": 2})
    echo("")
    echo("== fork child ==")
    echo(f"id {child.id}  parentSession {child.header.parent_session}")
    echo(f"header.is_seeded = {child.header.is_seeded}   inherited_event_count = {child.inherited_event_count}")
    for event in child.events:
        owner = "own" if child.is_own_seq(event.seq) else "inherited"
        echo(f"  seq {event.seq:>2}  {event.type:<18} {owner}")

    echo("")
    echo("== immutability ==")
    try:
        child.events[1]["data"]["content"] = []  # type: ignore[index]
    except TypeError as error:
        echo(f"mutating a committed event raises TypeError: {error}")
    try:
        store.fork(child)
    except Exception as error:
        echo(f"forking inside the open turn is refused: {getattr(error, 'code', '?')}: {error}")
    return 0
