"""One store seen by each side: headers, logs, catalogs, in a form the two can be compared in.

Layer: tests (interop). `pydsh_view` reads a JSONL root through a read-only `Runtime` (the way `dsh`
commands read); `harness_view` asks the TypeScript harness's own persistence, `inspect` and
`listChildren`/`listDescendants` for the same facts. Each log is either its events (plain JSON) or
the kind of refusal (`corrupt`, `unsupported`, `missing`), because the two sides word their errors
differently; the catalogs are the rows' wire JSON, in order. Two views of one store must be equal
unless an entry of `differences.ALLOWED` says why not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh.config import Config
from dsh.persistence.errors import SessionPersistenceError
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from tests.interop.harness import HarnessProcess, HarnessRefused
from tests.persistence.helpers import plain

__all__ = ["Log", "StoreView", "harness_kind", "harness_view", "pydsh_kind", "pydsh_view"]


@dataclass(frozen=True, slots=True)
class Log:
    """A log as one side reads it: its events, or the kind of refusal."""

    events: tuple[dict[str, Any], ...] | None = None
    refused: str | None = None

    @classmethod
    def of(cls, events: Iterable[Any]) -> Log:
        return cls(events=tuple(plain(events)))


@dataclass(slots=True)
class StoreView:
    """What one side makes of a store: listed headers, each log, and each asked-for catalog."""

    headers: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, Log] = field(default_factory=dict)
    children: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    descendants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def harness_kind(error: HarnessRefused) -> str:
    """The kind of a harness refusal: its corruption, format and not-found errors, by name or wording."""
    if error.name == "SessionFormatUnsupportedError":
        return "unsupported"
    if error.name == "SessionPersistenceCorruptionError" or "corrupt" in error.message:
        return "corrupt"
    if "empty or header-less" in error.message:
        return "corrupt"  # the JSONL backend's own words for a log without a complete header
    if "not found" in error.message:
        return "missing"
    return f"{error.name}: {error.message}"


def pydsh_kind(error: SessionPersistenceError) -> str:
    """The kind of a pydsh refusal, by its stable code."""
    return {
        "SESSION_CORRUPT": "corrupt",
        "SESSION_FORMAT_UNSUPPORTED": "unsupported",
        "SESSION_NOT_FOUND": "missing",
    }.get(error.code, f"{error.code}: {error.message}")


def _header(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored header record as the harness hands headers out: without the record's `type`."""
    return {key: value for key, value in stored.items() if key != "type"}


async def pydsh_view(
    sessions_root: Path, *, catalogs: Iterable[str] = (), descendants: Iterable[str] = (), config: Config | None = None
) -> StoreView:
    """The store under `sessions_root` as a read-only pydsh `Runtime` sees it."""
    view = StoreView()
    home = sessions_root.parent
    async with Runtime.open(config or Config(home=home), read_only=True) as rt:
        listing = await rt.persistence.list()
        for row in listing.rows:
            session_id = row.header.id
            try:
                observation = await rt.persistence.inspect(session_id)
            except SessionPersistenceError as error:
                view.logs[session_id] = Log(refused=pydsh_kind(error))
                continue
            view.headers[session_id] = _header(observation.header.to_stored(observation.inherited_event_count))
            view.logs[session_id] = Log.of(observation.events)
        for parent in catalogs:
            view.children[parent] = [row.to_json() for row in await rt.subagents.list_children(parent)]
        for root in descendants:
            view.descendants[root] = [entry.to_json() for entry in await rt.subagents.list_descendants(root)]
    return view


def harness_view(
    harness: HarnessProcess,
    sessions_root: Path,
    *,
    catalogs: Iterable[str] = (),
    descendants: Iterable[str] = (),
    compression: str = "zstd",
) -> StoreView:
    """The store under `sessions_root` as the TypeScript harness's own code sees it."""
    view = StoreView()
    where = {"root": sessions_root, "compression": compression}
    for header in harness.call("list", **where):
        session_id = header["id"]
        try:
            inspected = harness.call("inspect", session=session_id, **where)
        except HarnessRefused as error:
            view.logs[session_id] = Log(refused=harness_kind(error))
            continue
        view.headers[session_id] = inspected["meta"]
        view.logs[session_id] = Log(events=tuple(inspected["events"]))
    parents = list(catalogs)
    if parents:
        answers = harness.call("children", parents=parents, **where)
        for parent in parents:
            answer = answers[parent]
            if not answer["ok"]:
                raise HarnessRefused(answer["error"]["name"], answer["error"]["message"])
            view.children[parent] = answer["rows"]
    for root in descendants:
        view.descendants[root] = harness.call("descendants", session=root, **where)
    return view


def events_of(events: Iterable[SessionEvent]) -> list[dict[str, Any]]:
    """Events as plain JSON records."""
    return plain(events)
