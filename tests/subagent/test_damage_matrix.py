"""The damage matrix: one damaged child per case, healthy siblings around it.

Every case runs on the same catalog under `parent`: a live sibling (live identity), an unseeded sibling
with a real cache row (cached identity), an uncached unseeded sibling and a seeded sibling (observed
identity), plus the child `d-damaged`, damaged one way. Each case must yield exactly the row its kind of
damage calls for (docs/catalog.md#row-states), leave the siblings' rows and costs unchanged, and modify
no file: every file under the JSONL root and the cache database are hashed before and after each
listing (for damage applied after enumeration, "before" is taken right after the damage landed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
import pytest

from dsh.projection.cache_storage import CacheIdentity
from dsh.query.records import SessionRecord
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow, SubagentListEntry
from tests.subagent.helpers import (
    Record,
    Stack,
    child_events,
    desc,
    event,
    fork_events,
    install_hostile_subagent_unit,
    stored_header,
    turn_end,
    turn_start,
    user_message,
)
from tests.subagent.spies import SpyQuery

DAMAGED = "d-damaged"


def inactive(child_id: str, label: str) -> SubagentChildRow:
    """A cold continuable child row."""
    return SubagentChildRow(child_id, "continuable", "inactive", False, label=label)  # type: ignore[arg-type]


SIBLINGS: list[SubagentListEntry] = [
    SubagentChildRow("a-live", "continuable", "running", False, label="a-live"),  # type: ignore[arg-type]
    inactive("b-cached", "b-cached"),
    inactive("c-cold", "c-cold"),
    inactive("e-fork", "e-fork"),
]
SIBLING_OBSERVATIONS = {"c-cold": 1, "e-fork": 1}


@dataclass
class Case:
    """One damage kind: how to damage `d-damaged`, and the row (or absence) the listing must give."""

    name: str
    damage: Callable[[Stack, SpyQuery, dict[str, dict[str, str]]], Awaitable[None]]
    expected: SubagentListEntry | None
    observed: int = 1
    static: bool = True  # the damage is on disk before listing (so a second listing must match)


def corrupt() -> SubagentDiagnosticRow:
    """The damaged child as `corrupt`."""
    return SubagentDiagnosticRow(DAMAGED, "corrupt")  # type: ignore[arg-type]


def unavailable() -> SubagentDiagnosticRow:
    """The damaged child as `unavailable`."""
    return SubagentDiagnosticRow(DAMAGED, "unavailable")  # type: ignore[arg-type]


def _authored(
    events: list[Record], cut: int = 0
) -> Callable[[Stack, SpyQuery, dict[str, dict[str, str]]], Awaitable[None]]:
    async def damage(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
        await stack.author_child(DAMAGED, header={"createdAt": 4}, events=events, cut=cut)

    return damage


def _after_enumeration(
    mutate: Callable[[Stack], Awaitable[None]],
) -> Callable[[Stack, SpyQuery, dict[str, dict[str, str]]], Awaitable[None]]:
    """Author a healthy child, then apply `mutate` once, right after the corpus was listed."""

    async def damage(stack: Stack, spy: SpyQuery, hashes: dict[str, dict[str, str]]) -> None:
        await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc(DAMAGED)))

        async def once(records: list[SessionRecord], _signal: object) -> list[SessionRecord]:
            spy.after_list = None
            assert any(record.header.id == DAMAGED for record in records)
            await mutate(stack)
            hashes["before"] = await stack.file_hashes()
            return records

        spy.after_list = once

    return damage


async def _flip(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc(DAMAGED)))
    await stack.writer.flip_byte(DAMAGED, frame=1)


async def _delete(stack: Stack) -> None:
    stack.writer.remove(DAMAGED)


async def _republish(stack: Stack) -> None:
    header = stored_header(DAMAGED, parentSession="new-owner", createdAt=99)
    await stack.writer.write(DAMAGED, header, child_events(desc("the new owner's child")))


async def _poison_cache(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc(DAMAGED)))
    assert stack.cache_storage is not None
    rows = {"subagent": {"ver": 2, "seq": 3, "val": {"identity": {"mode": "one-shot", "label": 5, "seq": -1}}}}
    await stack.cache_storage.inner.put_raw(DAMAGED, CacheIdentity(4, None, 0), orjson.dumps(rows).decode())


async def _undecodable_cache(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc(DAMAGED)))
    assert stack.cache_storage is not None
    await stack.cache_storage.inner.put_raw(DAMAGED, CacheIdentity(4, None, 0), '{"subagent": {"ver": 2, "seq"')


async def _hostile(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc("poison me")))
    stack.disposers.append(install_hostile_subagent_unit(stack))


async def _torn(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc(DAMAGED)))
    await stack.writer.append(DAMAGED, [turn_start(4, 1), user_message(5)])
    await stack.writer.tear(DAMAGED, "last-block")


async def _garbage(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.author_child(DAMAGED, header={"createdAt": 4}, events=child_events(desc(DAMAGED)))
    await stack.writer.append_frame(DAMAGED, b"\x00 this is not json\n")
    await stack.writer.append(DAMAGED, [turn_start(4, 1), turn_end(5, 1)])


async def _unreadable_header(stack: Stack, _spy: SpyQuery, _hashes: dict[str, dict[str, str]]) -> None:
    await stack.writer.write(DAMAGED, stored_header("someone-else", createdAt=4), child_events(desc(DAMAGED)))


CASES = [
    Case("no-descriptor", _authored([turn_start(0), user_message(1), turn_end(2)]), corrupt()),
    Case(
        "malformed-descriptor",
        _authored(child_events({"version": 2, "mode": "continuable", "provider": "x"})),
        corrupt(),
    ),
    Case("unknown-descriptor-version", _authored(child_events(desc("future", v=3))), corrupt()),
    Case("ancestor-only-fork-seed", _authored(fork_events(None), cut=4), corrupt()),
    Case("log-deleted-after-enumeration", _after_enumeration(_delete), unavailable(), static=False),
    Case("flipped-byte-in-complete-frame", _flip, unavailable()),
    Case("republished-under-another-parent", _after_enumeration(_republish), corrupt(), static=False),
    Case("poisoned-cache-row", _poison_cache, inactive(DAMAGED, DAMAGED)),
    Case("undecodable-cache-row", _undecodable_cache, inactive(DAMAGED, DAMAGED)),
    Case("unit-raises", _hostile, corrupt()),
    Case("truncated-final-frame", _torn, inactive(DAMAGED, DAMAGED)),
    Case("garbage-line-before-turn-end", _garbage, unavailable()),
    Case(
        "unknown-non-ignorable-type",
        _authored([*child_events(desc(DAMAGED)), event("mystery/kind", 4, {})]),
        unavailable(),
    ),
    Case("header-id-mismatch", _unreadable_header, None, observed=0),
]


async def _siblings(stack: Stack) -> None:
    live = stack.live_child("a-live", session_id="a-live", created_at=1)
    await stack.store.flush(live)
    cached = stack.live_child("b-cached", session_id="b-cached", created_at=2)
    await stack.settle(cached)
    await stack.author_child("c-cold", header={"createdAt": 3})
    await stack.author_child("e-fork", header={"createdAt": 5}, events=fork_events(desc("e-fork")), cut=4)


def _expected(case: Case) -> list[SubagentListEntry]:
    rows = list(SIBLINGS)
    if case.expected is not None:
        rows.insert(3, case.expected)
    return rows


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_damaged_child_gets_its_row_and_nothing_else_changes(
    cache_stack: Stack, spy_query: SpyQuery, case: Case
) -> None:
    """One damaged child yields exactly its row; siblings and their costs are unchanged; no file changes."""
    stack = cache_stack
    await _siblings(stack)
    hashes: dict[str, dict[str, str]] = {}
    await case.damage(stack, spy_query, hashes)
    hashes["before"] = await stack.file_hashes()
    assert stack.cache_storage is not None
    puts = sum(stack.cache_storage.puts.values())
    rows = await stack.list_children()
    assert rows == _expected(case)
    assert "new owner" not in orjson.dumps([r.to_json() for r in rows]).decode()
    expected_observations = dict(SIBLING_OBSERVATIONS)
    if case.observed:
        expected_observations[DAMAGED] = case.observed
    assert spy_query.observed == expected_observations
    assert await stack.file_hashes() == hashes["before"]
    if case.static:
        assert await stack.list_children() == rows
        assert await stack.file_hashes() == hashes["before"]
    assert sum(stack.cache_storage.puts.values()) == puts
