"""The HTTP API over bad input: an unreadable child is counted, and no answer may be cached.

A real server on 127.0.0.1 (`tests/server/helpers.py`). A child whose log is a FIFO cannot be
listed (no trustworthy parent link), so `listSubagents` leaves it out of `entries` and counts it in
`unlisted`, the same number the library's `ListingReport` carries and `dsh agents` prints
(docs/storage-format.md#damage-stays-visible). Every `/api/v1` answer, errors included, says
`Cache-Control: no-store`: it holds session content no browser or proxy may keep.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dsh.subagent.listing import ListingReport
from tests.server.helpers import CHILD_LABEL, api, continuable_child, stored_session

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only


def _fifo_instead_of_log(home: Path, session_id: str) -> None:
    log = home / "sessions" / "_no-cwd" / session_id / "session.jsonl.zstd"
    log.unlink()
    os.mkfifo(log)


@pytest.mark.parametrize("scope", ["children", "descendants"])
async def test_list_subagents_counts_a_child_whose_log_is_a_fifo(tmp_path: Path, scope: str) -> None:
    """The FIFO child is no entry, `unlisted` is 1, and the library's report says 1 for the same listing."""
    home = tmp_path / "home"
    async with api(home) as ready:
        await stored_session(ready.rt, "parent")
        await continuable_child(ready.rt, "parent", "good")
        await continuable_child(ready.rt, "parent", "bad")
        _fifo_instead_of_log(home, "bad")
        response = await ready.http.get("/api/v1/sessions/parent/subagents", params={"scope": scope})
        reports: list[ListingReport] = []
        listed = await ready.rt.subagents.list_children("parent", report=reports.append)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert [entry["id"] for entry in body["entries"]] == ["good"]
    assert body["entries"][0]["label"] == CHILD_LABEL
    assert body["unlisted"] == 1
    assert [row.id for row in listed] == ["good"]
    assert reports[-1].unlisted == body["unlisted"]


async def test_a_clean_catalog_says_zero_unlisted(tmp_path: Path) -> None:
    """Without damage `unlisted` is 0, also for a parent nobody knows."""
    async with api(tmp_path / "home") as ready:
        await stored_session(ready.rt, "parent")
        await continuable_child(ready.rt, "parent", "good")
        known = await ready.http.get("/api/v1/sessions/parent/subagents")
        unknown = await ready.http.get("/api/v1/sessions/nobody/subagents")
    assert known.json()["unlisted"] == 0
    assert unknown.json() == {"entries": [], "parentAvailable": False, "unlisted": 0}


async def test_every_api_answer_says_no_store(tmp_path: Path) -> None:
    """JSON answers, error answers, the unauthenticated 401 and the public health check all carry no-store."""
    async with api(tmp_path / "home") as ready:
        await stored_session(ready.rt, "parent")
        answers = {
            "sessions": await ready.http.get("/api/v1/sessions"),
            "history": await ready.http.get("/api/v1/sessions/parent/history"),
            "catalog": await ready.http.get("/api/v1/sessions/parent/subagents"),
            "not found": await ready.http.get("/api/v1/sessions/nobody/history"),
            "bad request": await ready.http.get("/api/v1/sessions", params={"limit": "zero"}),
            "health": await ready.http.get("/api/v1/health"),
        }
        async with ready.anonymous() as anonymous:
            answers["unauthenticated"] = await anonymous.get("/api/v1/sessions")
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {
        "sessions": 200,
        "history": 200,
        "catalog": 200,
        "not found": 404,
        "bad request": 400,
        "health": 200,
        "unauthenticated": 401,
    }
    assert {name: answer.headers.get("cache-control") for name, answer in answers.items()} == dict.fromkeys(
        answers, "no-store"
    )
