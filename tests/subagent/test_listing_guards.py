"""The bare listing functions fail loudly on a bad setup, and unreadable stored entries are counted.

`list_children` / `list_descendants` called directly refuse a `cold_read_concurrency` outside
1..64 with `ConfigError` (`CONFIG_INVALID`) — never an `AssertionError`, which `python -O` would
strip — and a registry without the `subagent` unit with `SUBAGENT_CONTROL_UNITS_UNAVAILABLE`, never
omitted live children and false `corrupt` rows. Stored entries the corpus could not list are counted
in `ListingReport.unlisted`; a header only the TypeScript harness accepts lists as a row
(docs/catalog.md#enumeration).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh.errors import ConfigError
from dsh.projection.registry import ProjectionRegistry
from dsh.subagent.errors import SubagentError
from dsh.subagent.listing import ListingReport, list_children, list_descendants
from dsh.subagent.rows import SubagentChildRow
from tests.subagent.helpers import Stack, child_events, desc, stored_header
from tests.subagent.spies import SpyQuery


@pytest.mark.parametrize("concurrency", [0, -1, 65, True, 2.0, "4"])
@pytest.mark.parametrize("listing", [list_children, list_descendants])
async def test_a_bad_cold_read_concurrency_is_a_config_error(
    stack: Stack, listing: object, concurrency: object
) -> None:
    """A concurrency outside 1..64 (or not an int) raises `CONFIG_INVALID` before any read."""
    await stack.author_child("cold", events=child_events(desc("cold")))
    with pytest.raises(ConfigError) as caught:
        await listing(stack.services, "parent", cold_read_concurrency=concurrency)  # type: ignore[operator]
    assert caught.value.code == "CONFIG_INVALID"


async def test_a_concurrency_of_one_still_lists_every_cold_child(stack: Stack, spy_query: SpyQuery) -> None:
    """The smallest valid concurrency lists every cold child, one observation at a time."""
    for index in range(3):
        await stack.author_child(f"c{index}", header={"createdAt": index + 1}, events=child_events(desc(f"c{index}")))
    rows = await list_children(stack.services, "parent", cold_read_concurrency=1)
    assert [row.id for row in rows] == ["c0", "c1", "c2"]
    assert spy_query.max_in_flight == 1


@pytest.mark.parametrize("listing", [list_children, list_descendants])
async def test_a_registry_without_the_subagent_unit_is_refused(stack: Stack, listing: object) -> None:
    """A bare call against a registry lacking the `subagent` unit raises `SUBAGENT_CONTROL_UNITS_UNAVAILABLE`."""
    stack.live_child("live one", session_id="live")
    await stack.author_child("cold", events=child_events(desc("cold")))
    bare = ProjectionRegistry(stack.store)
    stack.services.projections = bare
    try:
        with pytest.raises(SubagentError) as caught:
            await listing(stack.services, "parent")  # type: ignore[operator]
        assert caught.value.code == "SUBAGENT_CONTROL_UNITS_UNAVAILABLE"
    finally:
        bare.close()


async def test_unreadable_stored_entries_are_counted_in_the_report(stack: Stack) -> None:
    """Entries the corpus cannot list are counted in `ListingReport.unlisted`; the rows are unchanged."""
    await stack.author_child("good", events=child_events(desc("good")))
    await stack.author_child("gone", events=child_events(desc("gone")))
    log = Path(stack.writer.path_of("gone"))
    log.unlink()
    log.mkdir()
    await stack.writer.write("bad-header", stored_header("bad-header", createdAt=-1), child_events(desc("x")))
    reports: list[ListingReport] = []
    rows = await stack.list_children(report=reports.append)
    assert [row.id for row in rows] == ["good"]
    assert reports[-1].unlisted == 2
    descendants: list[ListingReport] = []
    await stack.list_descendants(report=descendants.append)
    assert descendants[-1].unlisted == 2


async def test_a_clean_store_reports_nothing_unlisted(stack: Stack) -> None:
    """Without damaged entries the report's `unlisted` is 0."""
    await stack.author_child("good", events=child_events(desc("good")))
    reports: list[ListingReport] = []
    await stack.list_children(report=reports.append)
    assert reports[-1].unlisted == 0


async def test_a_child_with_a_windows_cwd_is_listed(stack: Stack) -> None:
    """A cold child whose header has a Windows `cwd` (accepted by the TypeScript harness) is a normal row."""
    record = stored_header("win", cwd="C:\\Users\\dev\\work", createdAt=1)
    await stack.writer.write("win", record, child_events(desc("from windows")))
    reports: list[ListingReport] = []
    rows = await stack.list_children(report=reports.append)
    assert rows == [SubagentChildRow("win", "continuable", "inactive", False, label="from windows")]  # type: ignore[arg-type]
    assert reports[-1].unlisted == 0
