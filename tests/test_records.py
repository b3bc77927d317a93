"""Every exported record is a frozen, slotted dataclass: `replace`, `asdict`, keyword `match` and pickle work.

`RECORDS` holds one example per record type that a public module exports; a test derives the record
types from the `__all__` of every public module and fails when one has no example, so a new record
cannot be left out. The examples hold real values where a record's checks look at them, and a
picklable `_Stand` where a record only carries a live object (an agent, a signal, the services).
"""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

import dsh
from dsh.agent.accounting import ListedFacts
from dsh.agent.approval import ApprovalDecision, ApprovalRequest, ApprovalRule, Permissions
from dsh.agent.assembler import ToolCall
from dsh.agent.compaction import CompactionResult, CompactionSettings
from dsh.agent.loop import AgentOptions, InboxItem, TurnResult
from dsh.agent.messages import NoticeSource, RelaySource, UserSource
from dsh.agent.model import (
    BlockEnd,
    BlockStart,
    Finish,
    ModelRequest,
    ReasoningDelta,
    RequestMeta,
    RetryPolicy,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh.agent.models import ResolvedModelSettings
from dsh.agent.tools import ToolContext, ToolHandle
from dsh.agent.usage import ModelPrice, TokenTotals
from dsh.cli.drive import Work
from dsh.config import Config
from dsh.config_files import LoadedConfig, Setting
from dsh.demo.damage import Damage
from dsh.demo.home import DemoHome
from dsh.demo.scenario import CatalogView, DemoResult
from dsh.doctor import Check, DoctorReport, Problem
from dsh.json import FrozenDict
from dsh.persistence import DamagedSession, EventSlice, PersistenceObservation, SessionListing, StoredSessionInfo
from dsh.persistence.base import Fence, HeaderRow, Revision, StoredLog, TornMarker
from dsh.persistence.memory import StoredSession
from dsh.persistence.postgres import LeaseRow, RequestRow
from dsh.projection import ClientView, ProjectionSnapshot, ProjectionUnit, Restored
from dsh.projection.cache import ProjectionCacheConfig
from dsh.projection.cache_storage import CacheIdentity, CacheRecord
from dsh.query import HistoryPage, QueryConfig, SessionFilter, SessionLineage, SessionObservation, SessionRecord
from dsh.query.history import PageBounds
from dsh.server.deltas import DeltaFrame
from dsh.server.replicas import ReplicaSettings
from dsh.server.security import ServeToken
from dsh.server.stream import Frame
from dsh.session import HeaderInit, SessionEvent, SessionHeader, SessionId, SurfaceReplace
from dsh.session.events import make_event
from dsh.session.header import SessionSeq
from dsh.session.validate import LogProblem, Refusal
from dsh.subagent.authority import AncestorAuthority, UserAuthority
from dsh.subagent.descriptor import ContinuableDescriptor, OneShotDescriptor, ToolFilter
from dsh.subagent.listing import ListingReport, SubagentIdentity
from dsh.subagent.providers import (
    ContinuablePreparation,
    ContinuableSpec,
    ContinuableStarted,
    ProviderCapabilities,
    SubagentRequest,
    SubagentResult,
)
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentDiagnosticRow
from dsh.testing import ConformanceTarget, IOFault
from dsh.testing.fake_openai import FakeReply, FakeToolCall, RecordedRequest
from dsh.testing.faulty import AppendRecord
from dsh.testing.server import LiveServer
from dsh.testing.upstream_logs import UpstreamLog
from dsh.tools.mcp import McpServerReport, McpToolInfo
from dsh.tools.workspace import SandboxSettings
from tests.helpers import exported_classes

NOT_RECORDS: Mapping[type, str] = {
    StoredSession: "the memory backend's stored state, which its fixture writers edit in place",
    ToolHandle: "a registration handle: `dispose()` unregisters the tool",
    DemoResult: "what the demo walkthrough fills in as it goes",
    UpstreamLog: "a log builder's output, appended to while the log is built",
}
"""Exported dataclasses that are mutable containers, not records (like `Services`), and why."""


@dataclasses.dataclass(frozen=True)
class _Stand:
    """A picklable stand-in for a live object a record only carries."""

    name: str


@dataclasses.dataclass(frozen=True)
class _Schema:
    """A schema that accepts every value (compared by value, so a pickled copy is equal)."""

    def validate_python(self, value: object, /) -> object:
        return value


def _init() -> dict[str, Any]:
    return {"n": 0}


def _apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def _render(state: Mapping[str, Any]) -> object:
    return state["n"]


def _other_render(state: Mapping[str, Any]) -> object:
    return None


def _memory_backend() -> Any:
    return dsh.MemoryBackend()


HEADER = SessionHeader(version=1, id=SessionId("s1"), created_at=1_700_000_000_000, cwd="/w")
EVENT = make_event("turn/start", 0, 1_700_000_000_001, FrozenDict({"turn": 1}))
SNAPSHOT = ProjectionSnapshot(0, FrozenDict({"count": 1}))
VIEW: ClientView[Any, Any] = ClientView(_render, _Schema())
CHILD = SubagentChildRow(SessionId("c1"), "continuable", "running", False, "worker")
RECORD = SessionRecord(HEADER, live=True, persisted=False)
CHECKPOINT = {"count": {"ver": 1, "seq": 0, "val": {"n": 1}}}
META = RequestMeta("s1", "main", 1, 1)
USAGE = Usage(10, 2)
STAND = _Stand("live object")


class _ComparableError(OSError):
    """An error equal to another of its kind with the same arguments (copies and pickles compare equal)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.args == other.args  # type: ignore[union-attr]

    def __hash__(self) -> int:
        return hash(self.args)


RECORDS: dict[type, tuple[object, dict[str, Any]]] = {
    # type: (an example, the changes a `replace` test makes)
    ApprovalDecision: (ApprovalDecision("allowed-once"), {"always": True}),
    ApprovalRequest: (ApprovalRequest("a1", "s1", "main", "bash", "ls", "$ ls", "ls", "c1", 0), {"label": "Checker"}),
    ApprovalRule: (ApprovalRule("bash", "ls *", "allow"), {"action": "deny"}),
    CompactionResult: (CompactionResult("c1", 10, 11, 13, "summary", (1, 2, 3), 120), {"pruned": 2}),
    CompactionSettings: (CompactionSettings(context_windows={"m": 8000}), {"threshold": 0.5}),
    ListedFacts: (ListedFacts("A title", TokenTotals(10, 5, requests=1)), {"title": "Another"}),
    ModelPrice: (ModelPrice(0.28, 0.028, 0.42), {"currency": "EUR"}),
    TokenTotals: (TokenTotals(100, 20, 50, requests=2, cost=0.01, currency="USD"), {"output_tokens": 30}),
    LoadedConfig: (LoadedConfig(Config(database_url="memory:"), {"home": "default"}, ()), {"files": (Path("/c"),)}),
    Permissions: (Permissions(rules=(ApprovalRule("bash", "*", "ask"),)), {"policy": "never"}),
    SandboxSettings: (SandboxSettings(), {"network": True}),
    Setting: (Setting("model.model", "m", "default"), {"source": "environment DSH_MODEL"}),
    ClientView: (VIEW, {"render": _other_render}),
    HeaderInit: (HeaderInit(cwd="/w", delegation_depth=1), {"cwd": "/x"}),
    ProjectionSnapshot: (SNAPSHOT, {"as_of_seq": 4}),
    ProjectionUnit: (
        ProjectionUnit("count", 1, _init, _apply, _Schema(), VIEW, frozenset({"turn/start"})),
        {"state_version": 2},
    ),
    SessionHeader: (HEADER, {"cwd": "/x"}),
    SubagentChildRow: (CHILD, {"activity": "inactive"}),
    SubagentDescendantEntry: (SubagentDescendantEntry(CHILD, SessionId("s1"), 1), {"depth": 2}),
    SubagentDiagnosticRow: (SubagentDiagnosticRow(SessionId("c2"), "corrupt"), {"reason": "unavailable"}),
    ToolCall: (ToolCall("call-1", "read", "{}"), {"name": "write"}),
    AgentOptions: (AgentOptions(model="m"), {"max_steps": 3}),
    InboxItem: (InboxItem("m1", ({"type": "text", "text": "hi"},), {"kind": "user"}), {"message_id": "m2"}),
    TurnResult: (TurnResult("s1", "m1", 1, "done", "completed", USAGE), {"output": "other"}),
    NoticeSource: (NoticeSource("c1", "finished"), {"summary": "failed"}),
    RelaySource: (RelaySource("s1"), {"sender_session_id": "s2"}),
    UserSource: (UserSource(rpc_id="r1"), {"client_time_zone": "UTC"}),
    BlockEnd: (BlockEnd(0, {"type": "text", "text": "hi"}), {"index": 1}),
    BlockStart: (BlockStart(0, "text"), {"block_type": "reasoning"}),
    Finish: (Finish("stop"), {"kind": "length"}),
    ModelRequest: (ModelRequest("m", None, (), (), META), {"model": "n"}),
    ReasoningDelta: (ReasoningDelta(0, "so"), {"text": "then"}),
    RequestMeta: (META, {"step": 2}),
    TextDelta: (TextDelta(0, "hi"), {"text": "ho"}),
    ToolCallDelta: (ToolCallDelta(0, "call-1", "{"), {"name": "read"}),
    Usage: (USAGE, {"output_tokens": 3}),
    UsageChunk: (UsageChunk(USAGE), {"usage": Usage(1, 1)}),
    ResolvedModelSettings: (
        ResolvedModelSettings("http://127.0.0.1:1", SecretStr("key"), "m", "deepseek", 30.0, 2, None, "api_key"),
        {"model": "n"},
    ),
    ToolContext: (ToolContext(None, "call-1", STAND, STAND), {"call_id": "call-2"}),
    RetryPolicy: (RetryPolicy(max_retries=3), {"max_retries": 5}),
    McpToolInfo: (McpToolInfo("read", "mcp__files__read", "Read a file."), {"description": "Read."}),
    McpServerReport: (
        McpServerReport("files", "stdio", "srv --stdio", enabled=True, started=False, error="exited"),
        {"started": True, "error": None},
    ),
    Damage: (Damage("s1", 5, 3, (3, 4), False), {"cache_evicted": True}),
    DemoHome: (DemoHome(Path("/tmp/home"), True), {"temporary": False}),
    Work: (Work(Path("/w"), None, ["bash"], [], False), {"allow_all": True}),
    CatalogView: (CatalogView("live", [CHILD], {"c1": 1}, {"c1": 0}), {"title": "cold"}),
    Check: (Check("home", "ok", "exists"), {"status": "warn"}),
    DoctorReport: (DoctorReport("/h", (Check("home", "ok", "exists"),), (), 1), {"sessions": 2}),
    Problem: (Problem("corrupt", "fail", "s1", "/h/s1.jsonl", "bad header"), {"fix": "dsh doctor --fix"}),
    DamagedSession: (DamagedSession("/h/s1.jsonl", "SESSION_CORRUPT", "bad header"), {"session_id": "s1"}),
    EventSlice: (EventSlice(HEADER, 0, Revision("r1"), 1, (EVENT,)), {"next_seq": 2}),
    PersistenceObservation: (PersistenceObservation(HEADER, (EVENT,), 0, Revision("r1"), False, 0), {"live": True}),
    SessionListing: (SessionListing([StoredSessionInfo(HEADER, Revision("r1"))]), {"rows": []}),
    StoredSessionInfo: (StoredSessionInfo(HEADER, Revision("r1")), {"revision": Revision("r2")}),
    Fence: (Fence("s1", "holder", 1), {"generation": 2}),
    HeaderRow: (HeaderRow(HEADER.to_stored(0), Revision("r1"), HEADER), {"header": None}),
    StoredLog: (StoredLog(HEADER.to_stored(0), [dict(EVENT)], Revision("r1")), {"next_seq": 1}),
    TornMarker: (TornMarker(10, (dict(EVENT),), 4, 0), {"removed_records": 1}),
    LeaseRow: (LeaseRow("s1", "holder", 1, datetime(2026, 1, 1, tzinfo=UTC), False), {"expired": True}),
    Restored: (Restored(SNAPSHOT, CHECKPOINT), {"checkpoint": {}}),
    ProjectionCacheConfig: (ProjectionCacheConfig(10, 100, 1.0), {"write_every_events": 20}),
    CacheIdentity: (CacheIdentity(1, None, 0), {"cwd": "/w"}),
    CacheRecord: (CacheRecord(CacheIdentity(1, None, 0), CHECKPOINT, 5), {"rows": {}}),
    HistoryPage: (
        HistoryPage(SessionId("s1"), HEADER, 0, False, (EVENT,), False, None, SNAPSHOT),
        {"has_more": True, "next_before_seq": 0},
    ),
    QueryConfig: (QueryConfig(10, 20), {"history_default_messages": 20}),
    SessionFilter: (SessionFilter(frozenset({"p1"})), {"parents": None}),
    SessionLineage: (SessionLineage(RECORD, (), (), True, RECORD, None), {"complete": False}),
    SessionObservation: (SessionObservation(HEADER, (EVENT,), 0, False), {"torn_tail": True}),
    SessionRecord: (RECORD, {"persisted": True}),
    PageBounds: (PageBounds(0, 1), {"end": 2}),
    ServeToken: (ServeToken("token", Path("/h/serve-token"), True), {"fresh": False}),
    ReplicaSettings: (ReplicaSettings(), {"idle_release_s": 0.0}),
    RequestRow: (RequestRow(1, "s1", "prompt", {"content": []}, "a@h:1", "pending", None, None), {"state": "done"}),
    Frame: (Frame(1, "session/event", {"sessionId": "s1"}), {"id": 2}),
    DeltaFrame: (DeltaFrame("session/delta", {"sessionId": "s1", "text": "a"}), {"event": "session/other"}),
    SurfaceReplace: (SurfaceReplace(0, 2), {"end": 3}),
    LogProblem: (LogProblem(3, "seq", "seq 4 where 3 was expected", 4), {"index": 4}),
    Refusal: (Refusal(0, "unknown", "x/new", "unknown event type"), {"kind": "legacy"}),
    AncestorAuthority: (AncestorAuthority(STAND), {"agent": _Stand("other")}),
    UserAuthority: (UserAuthority("s1"), {"parent_session_id": "s2"}),
    ContinuableDescriptor: (ContinuableDescriptor(provider="spawn", label="worker"), {"persona": "careful"}),
    OneShotDescriptor: (OneShotDescriptor(provider="spawn"), {"label": "once"}),
    ToolFilter: (ToolFilter(allow=("read",)), {"deny": ("write",)}),
    ListingReport: (ListingReport({SessionId("c1"): 1}, 1), {"unlisted": 2}),
    SubagentIdentity: (SubagentIdentity("continuable", SessionSeq(0), "worker"), {"seq": SessionSeq(3)}),
    ContinuablePreparation: (ContinuablePreparation(), {"seed": (dict(EVENT),)}),
    ContinuableSpec: (ContinuableSpec(STAND, "go", "worker"), {"prompt": "stop"}),
    ContinuableStarted: (ContinuableStarted("c1", "m1"), {"message_id": "m2"}),
    ProviderCapabilities: (ProviderCapabilities(), {"persona": True}),
    SubagentRequest: (SubagentRequest(STAND, "go"), {"label": "once"}),
    SubagentResult: (SubagentResult("completed"), {"stop_reason": "error"}),
    ConformanceTarget: (
        ConformanceTarget(_memory_backend, STAND, "memory"),
        {"name": "memory-2"},
    ),
    FakeReply: (FakeReply(text="hi"), {"chunks": 3}),
    FakeToolCall: (FakeToolCall("read", "{}"), {"id": "call-1"}),
    RecordedRequest: (RecordedRequest(1, "POST", "/v1/chat/completions", {"a": "b"}, {}), {"number": 2}),
    AppendRecord: (AppendRecord(None, "s1", 0, 1, False), {"materialized": True}),
    IOFault: (IOFault("sync", _ComparableError(5, "io")), {"kind": "partial-write"}),
    LiveServer: (LiveServer("http://127.0.0.1:1", "token", STAND), {"token": "other"}),
}

_TYPES = sorted(RECORDS, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
_IDS = [f"{cls.__module__}.{cls.__qualname__}" for cls in _TYPES]
_MISS = object()
ROOT = Path(__file__).resolve().parents[1]


def _exported_records() -> set[type]:
    """The record types the public modules export: every dataclass or tuple-based class in an `__all__`."""
    return {
        cls
        for cls in exported_classes()
        if (dataclasses.is_dataclass(cls) or issubclass(cls, tuple)) and cls not in NOT_RECORDS
    }


def _keyword_match(value: object, cls: type, name: str) -> object:
    """`match value: case cls(<name>=found)`, written out for one field name; `_MISS` when it does not match."""
    source = f"match value:\n    case cls({name}=found):\n        result = found\n    case _:\n        result = miss\n"
    namespace: dict[str, object] = {"value": value, "cls": cls, "miss": _MISS}
    exec(source, namespace)  # the keyword of a class pattern must be written in the source
    return namespace["result"]


def test_every_exported_record_has_an_example() -> None:
    """The examples cover exactly the records the public modules export (a new record needs one here)."""
    exported = _exported_records()
    assert {f"{cls.__module__}.{cls.__qualname__}" for cls in exported - set(RECORDS)} == set()
    assert {f"{cls.__module__}.{cls.__qualname__}" for cls in set(RECORDS) - exported} == set()
    assert {dsh.HeaderInit, dsh.SubagentChildRow, dsh.ProjectionUnit, SessionRecord} <= exported


@pytest.mark.parametrize("cls", _TYPES, ids=_IDS)
def test_a_record_is_a_frozen_slotted_dataclass(cls: type) -> None:
    """The record is a dataclass, frozen (assignment raises), slotted (no `__dict__`) and not a tuple."""
    example, _ = RECORDS[cls]
    assert type(example) is cls
    assert dataclasses.is_dataclass(cls)
    assert not issubclass(cls, tuple)
    assert "__slots__" in cls.__dict__
    assert not hasattr(example, "__dict__")
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(example, first, getattr(example, first))


@pytest.mark.parametrize("cls", _TYPES, ids=_IDS)
def test_replace_builds_a_changed_copy(cls: type) -> None:
    """`dataclasses.replace` returns a new record of the same type with the change and every other field kept."""
    example, changes = RECORDS[cls]
    changed = dataclasses.replace(example, **changes)
    assert type(changed) is cls
    assert changed is not example
    for field in dataclasses.fields(cls):
        expected = changes.get(field.name, getattr(example, field.name))
        if field.init:
            assert getattr(changed, field.name) == expected, field.name


def _records_as_dicts(value: object) -> object:
    """`value` with every record in it (inside lists, tuples and dicts too) replaced by its field dict."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _records_as_dicts(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return type(value)(_records_as_dicts(item) for item in value)
    if isinstance(value, dict):
        return {key: _records_as_dicts(item) for key, item in value.items()}
    return value


@pytest.mark.parametrize("cls", _TYPES, ids=_IDS)
def test_asdict_gives_every_field(cls: type) -> None:
    """`dataclasses.asdict` gives one entry per field, each equal to the field (nested records as dicts)."""
    example, _ = RECORDS[cls]
    data = dataclasses.asdict(example)
    assert list(data) == [field.name for field in dataclasses.fields(cls)]
    for field in dataclasses.fields(cls):
        assert data[field.name] == _records_as_dicts(getattr(example, field.name)), field.name


@pytest.mark.parametrize("cls", _TYPES, ids=_IDS)
def test_a_keyword_class_pattern_matches_every_field(cls: type) -> None:
    """`case Record(field=x)` matches the record and binds the field, for every field; another object misses."""
    example, _ = RECORDS[cls]
    for field in dataclasses.fields(cls):
        assert _keyword_match(example, cls, field.name) is getattr(example, field.name), field.name
    assert _keyword_match(_Stand("other"), cls, dataclasses.fields(cls)[0].name) is _MISS


@pytest.mark.parametrize("cls", _TYPES, ids=_IDS)
def test_a_record_never_equals_a_tuple_and_survives_pickle(cls: type) -> None:
    """A record is unequal to the tuple of its fields, and a pickled copy is equal and of the same type."""
    example, _ = RECORDS[cls]
    assert example != tuple(getattr(example, field.name) for field in dataclasses.fields(cls))
    copy = pickle.loads(pickle.dumps(example))
    assert type(copy) is cls
    assert copy == example


def test_keyword_patterns_tell_the_catalog_rows_apart() -> None:
    """A `match` over `list_children` rows reads kind-specific fields by keyword, as users write it."""

    def describe(row: object) -> str:
        match row:
            case dsh.SubagentChildRow(id=child, mode="continuable", label=label):
                return f"{child}: {label}"
            case dsh.SubagentChildRow(id=child, mode="one-shot"):
                return f"{child}: one-shot"
            case dsh.SubagentDiagnosticRow(id=child, reason=reason):
                return f"{child}: {reason}"
        return "other"

    rows = [CHILD, SubagentChildRow(SessionId("c3"), "one-shot", "inactive", True), RECORDS[SubagentDiagnosticRow][0]]
    assert [describe(row) for row in rows] == ["c1: worker", "c3: one-shot", "c2: corrupt"]


def test_replace_runs_a_records_checks_again() -> None:
    """A `replace` that breaks a record's rule raises as the constructor does (the checks live in `__post_init__`)."""
    with pytest.raises(ValueError, match="requires a label"):
        dataclasses.replace(CHILD, label=None)
    with pytest.raises(dsh.ConfigError, match="history_default_messages"):
        dataclasses.replace(QueryConfig(), history_default_messages=500)


def test_cache_records_compare_without_their_write_time() -> None:
    """Two cache records with the same identity and rows are equal whatever their `updated_at`."""
    record, _ = RECORDS[CacheRecord]
    assert dataclasses.replace(record, updated_at=99) == record


async def test_asdict_of_a_cold_read_copies_its_events(tmp_path: Path) -> None:
    """`asdict` of a real cold observation gives the header and the events read from the store."""
    config = dsh.Config(home=tmp_path)
    async with dsh.Runtime.open(config) as rt:
        session = rt.sessions.create("cold")
        session.append("turn/start", {"turn": 1})
        await rt.sessions.flush(session)
        rt.sessions.dispose(session)
    async with dsh.Runtime.open(config) as rt:
        observation = await rt.query.observe_session("cold")
    assert observation.live is False
    data = dataclasses.asdict(observation)
    assert data["header"] == dataclasses.asdict(observation.header)
    assert [dict(event) for event in data["events"]] == [dict(event) for event in observation.events]


@pytest.mark.slow
def test_a_type_checker_sees_every_record_frozen(tmp_path: Path) -> None:
    """mypy reports an assignment to a field of every record type as an error (it knows they are frozen).

    It runs with the project's settings and cache, which `make typecheck` has filled for the package.
    """
    lines = ["from typing import Any", "import dsh"]
    lines += sorted({f"import {cls.__module__}" for cls in _TYPES if cls.__module__ != "dsh"})
    for index, cls in enumerate(_TYPES):
        field = dataclasses.fields(cls)[0].name
        arguments = f"[{', '.join('Any' for _ in cls.__parameters__)}]" if getattr(cls, "__parameters__", ()) else ""
        annotation = f"{cls.__module__}.{cls.__qualname__}{arguments}"
        lines.append(f"def f{index}(x: {annotation}, v: Any) -> None: x.{field} = v")
    snippet = tmp_path / "assign.py"
    snippet.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(snippet)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    flagged = {int(line.split(":")[1]) for line in errors}
    first = len(lines) - len(_TYPES) + 1
    assert flagged == set(range(first, len(lines) + 1)), done.stdout
    assert all("read-only" in line or "frozen" in line for line in errors), done.stdout
