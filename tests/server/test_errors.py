"""The one code → status table: every wire code, triggered, answers its status in the one error body shape;
docs/errors.md lists the same wire codes and the same library mapping."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.errors import AgentError, ModelError
from dsh.agent.loop import Agent
from dsh.server.errors import LIBRARY_CODES, STATUS, WireError
from dsh.subagent.errors import SubagentError
from dsh.testing.jsonl_writer import JsonlLogWriter
from tests.server.helpers import Api, assert_error, one_shot_child, seed_family, stored_session

DOCS = Path(__file__).resolve().parents[2] / "docs"
PROMPT = {"content": [{"type": "text", "text": "hi"}]}


def _raising(error: BaseException) -> Callable[..., Any]:
    async def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


@pytest.mark.slow
async def test_every_wire_code_answers_the_status_of_the_table(served: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wire code but `cancelled` (whose client is gone; see the disconnect test) is triggered and checked."""
    rt = served.rt
    http = served.http
    family = await seed_family(rt, live_parent=True)
    await one_shot_child(rt, "plain-parent", "fenced-child")
    await stored_session(rt, "broken")
    await JsonlLogWriter(rt.config.sessions_dir).damage_events("broken")
    sub = f"/api/v1/sessions/{family.parent}/subagents"
    seen: set[str] = set()

    def expect(response: Any, code: str) -> None:
        assert_error(response, STATUS[code], code)
        seen.add(code)

    expect(await http.get("/api/v1/sessions", params={"limit": 0}), "bad-request")
    expect(
        await http.post("/api/v1/sessions/x/prompt", json={**PROMPT, "clientTimeZone": "Mars/Olympus"}),
        "invalid-time-zone",
    )
    async with served.anonymous() as anonymous:
        expect(await anonymous.get("/api/v1/sessions"), "unauthenticated")
    expect(await http.get("/api/v1/no-such-route"), "not-found")
    expect(await http.get("/api/v1/sessions/nobody"), "session-not-found")
    expect(await http.get(f"{sub}/nobody/history"), "subagent-not-found")
    expect(await http.delete("/api/v1/sessions"), "method-not-allowed")
    expect(await http.post("/api/v1/sessions/fenced-child/prompt", json=PROMPT), "agent-busy")
    expect(await http.get(f"{sub}/{family.diagnostic}/history"), "subagent-catalog-diagnostic")
    expect(
        await http.post(f"/api/v1/sessions/nobody/subagents/{family.continuable}/prompt", json=PROMPT),
        "subagent-parent-unavailable",
    )
    expect(
        await http.post("/api/v1/sessions", content=b" " * (2 << 20), headers={"content-type": "application/json"}),
        "payload-too-large",
    )
    expect(
        await http.post("/api/v1/sessions", content=b"hi", headers={"content-type": "text/plain"}),
        "unsupported-media-type",
    )
    expect(await http.get("/api/v1/sessions/broken/history"), "session-unreadable")
    expect(await http.post("/api/v1/approvals/nobody", json={"decision": "allow"}), "approval-not-found")
    for code, wire in (
        ("UNAUTHORIZED", "subagent-unauthorized"),
        ("NOT_RESUMABLE", "subagent-not-resumable"),
        ("DRAINING", "subagent-delivery-unavailable"),
        ("DUPLICATE_PROVIDER", "internal"),
    ):
        monkeypatch.setattr(rt.subagents, "followup", _raising(SubagentError("refused", code)))
        expect(await http.post(f"{sub}/{family.continuable}/prompt", json=PROMPT), wire)

    # (the real failure of a summary request is tests/server/test_compaction_routes.py's)
    monkeypatch.setattr(Agent, "compact", _raising(AgentError("no summary", code="COMPACTION_FAILED")))
    expect(await http.post(f"/api/v1/sessions/{family.parent}/compact"), "compaction-failed")

    def no_model() -> Any:
        raise ModelError("no key", code="MODEL_NOT_CONFIGURED")

    monkeypatch.setattr(rt, "model_client", no_model)
    expect(await http.post("/api/v1/sessions", json={"prompt": "hi"}), "model-unavailable")
    assert seen == set(STATUS) - {"cancelled"}


def test_wire_error_refuses_a_code_outside_the_table() -> None:
    """`WireError` only carries codes of the table; the status comes from the table and nowhere else."""
    with pytest.raises(ValueError, match="unknown wire code"):
        WireError("teapot", "no")
    assert WireError("subagent-delivery-unavailable", "later").headers() == {"Retry-After": "1"}
    assert {WireError(code, "x").status for code in STATUS} == set(STATUS.values())


def _doc_section(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_the_server_docs_list_exactly_the_wire_codes_and_statuses() -> None:
    """docs/server.md's error table names every wire code once, with the status the code table gives it."""
    text = _doc_section("server.md")
    rows = re.findall(r"^\| (\d{3}) \| `([a-z-]+)` \|", text, flags=re.MULTILINE)
    assert {code: int(status) for status, code in rows} == dict(STATUS)
    assert len(rows) == len(STATUS)


def test_the_http_column_of_the_error_catalog_follows_the_library_mapping() -> None:
    """Every code row of docs/errors.md shows `<status> <wire-code>` exactly for the codes the server maps, else —."""
    text = _doc_section("errors.md")
    table = text.split("## Codes", 1)[1].split("\n## ", 1)[0]
    found: dict[str, str] = {}
    for line in table.splitlines():
        match = re.match(r"^\| `([A-Z][A-Z0-9_]+)` \|.*\| ([^|]+) \|\s*$", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    assert found, "no code rows found"
    for code, cell in found.items():
        wire = LIBRARY_CODES.get(code)
        expected = "—" if wire is None else f"{STATUS[wire]} `{wire}`"
        assert cell == expected, code
    assert set(LIBRARY_CODES) <= set(found)
