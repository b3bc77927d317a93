"""Headless snapshots: keyless runs of real agents compared with the expected files in `examples/`.

Each scenario lives in `examples/headless-agent/snapshots/<name>/` with its script and its expected
files. `subagent-list-agents` is the healthy path (a background child, its settlement notice, the
`list_agents` line of a ready child); `subagent-diagnostic` is the damaged path, run through
`dsh run --json` in a fresh interpreter; `demo-plain` is the stdout of `dsh demo --plain`.
`DSH_SNAPSHOT=refresh` rewrites the expected files; otherwise a difference fails with a unified diff.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dsh.agent.ids import SequentialIds
from dsh.agent.models import ScriptedModelClient
from dsh.cli.main import app
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.testing.stored_logs import StepClock
from tests.snapshots.helpers import SNAPSHOTS, assert_golden, normalize_log, normalize_text, stored_log
from tests.tools.helpers import result_texts

PARENT = "11111111-1111-4111-8111-111111111111"
CHILD = "33333333-3333-4333-8333-333333333333"
DIAGNOSTIC_PARENT = "subagent-diagnostic-parent"
DIAGNOSTIC_CHILD = "subagent-diagnostic-child"
RESTART_PROMPT = "Call list_agents once and report what it shows."
_GUARD_S = 120  # seconds; only guards against a hang

runner = CliRunner()


class _PinnedSessionIds(SequentialIds):
    """Sequential ids whose session stream yields the given ids first."""

    def __init__(self, *sessions: str) -> None:
        super().__init__()
        self._sessions = list(sessions)

    def session(self) -> str:
        """The next pinned id, then sequential ones."""
        return self._sessions.pop(0) if self._sessions else super().session()


def _schemas_text(rt: Runtime) -> str:
    return json.dumps(rt.tools.schemas(), indent=2, ensure_ascii=False) + "\n"


async def _list_agents_scenario(home: Path, cwd: Path) -> dict[str, Any]:
    folder = SNAPSHOTS / "subagent-list-agents"
    client = ScriptedModelClient.from_file(folder / "script.json")
    ids = _PinnedSessionIds(PARENT, CHILD)
    async with Runtime.open(Config(home=home), model=client, ids=ids, clock=StepClock()) as rt:
        parent = await rt.create_agent(cwd=str(cwd))
        first = await rt.run("Start a background helper that replies CHILD_OK.", parent.id)
        await asyncio.wait_for(rt.settle(timeout=None), _GUARD_S)
        third = await rt.run("Call list_agents once.", parent.id)
        client.assert_consumed()
        events = list(parent.session.events)
        schemas = _schemas_text(rt)
    return {"first": first, "third": third, "events": events, "schemas": schemas}


def test_subagent_list_agents_snapshot(tmp_path: Path) -> None:
    """A background child settles, its notice starts turn 2, and turn 3's `list_agents` shows it `[ready]`."""
    home, cwd = tmp_path / "home", tmp_path / "work"
    cwd.mkdir()
    run = asyncio.run(_list_agents_scenario(home, cwd))
    assert (run["first"].output, run["third"].output) == ("STARTED", "LISTED")
    turns = [(event.data["turn"], event.data["reason"]["kind"]) for event in run["events"] if event.type == "turn/end"]
    assert turns == [(1, "completed"), (2, "completed"), (3, "completed")]
    notices = [
        event.data
        for event in run["events"]
        if event.type == "user/message" and event.data["source"]["kind"] == "subagent-settled"
    ]
    assert len(notices) == 1
    notice_text = "".join(block["text"] for block in notices[0]["content"])
    assert notice_text == (
        f"Subagent {CHILD} finished and will do no further work unless it is sent more.\nIts closing message:\nCHILD_OK"
    )
    assert notices[0]["source"]["senderSessionId"] == CHILD
    assert result_texts(run["events"])[-1] == f"{CHILD} [ready] — Reply with CHILD_OK"
    folder = SNAPSHOTS / "subagent-list-agents"
    log = asyncio.run(stored_log(home / "sessions", PARENT))
    paths = {str(home): "{{home}}", str(cwd): "{{cwd}}"}
    assert_golden(folder / "session.expected.jsonl", normalize_log(log, paths, keep_ids={PARENT, CHILD}))
    assert_golden(folder / "tool-schemas.expected.json", run["schemas"])


def _message(message_id: str, role: str, text: str, **source: Any) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": role,
        "content": [{"type": "text", "text": text}],
        "source": source or {"kind": "user"},
    }


async def _seed_diagnostic_home(home: Path, cwd: Path) -> None:
    """A parent with one completed turn, and a subagent child without a descriptor (an interrupted wreck)."""
    async with Runtime.open(Config(home=home), clock=StepClock()) as rt:
        parent = rt.sessions.create(DIAGNOSTIC_PARENT, header=HeaderInit(cwd=str(cwd)))
        parent.append("turn/start", {"turn": 1})
        parent.append("step/start", {"turn": 1, "step": 1})
        parent.append("user/message", _message("diagnostic-user-1", "user", "Start a helper."))
        source = {"kind": "model", "provider": "scripted", "model": "scripted-snapshot"}
        answer = _message("diagnostic-assistant-1", "assistant", "HELPER_STARTED", **source)
        parent.append("assistant/message", {"turn": 1, "step": 1, "message": answer})
        parent.append("step/end", {"turn": 1, "step": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        child = rt.sessions.create(
            DIAGNOSTIC_CHILD,
            header=HeaderInit(cwd=str(cwd), parent_session=DIAGNOSTIC_PARENT, origin="subagent", delegation_depth=1),
        )
        child.append("turn/start", {"turn": 1})
        child.append("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}})
        for session in (parent, child):
            await rt.sessions.flush(session)


def _clean_environment() -> dict[str, str]:
    """The test's environment without any `DSH_*` or model key variable."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("DSH_") and key not in {"DEEPSEEK_API_KEY", "NO_COLOR"}
    }


_LOG_LINE = re.compile(r"^(WARNING|ERROR|CRITICAL):")


@pytest.mark.slow
def test_subagent_diagnostic_snapshot(tmp_path: Path) -> None:
    """`dsh run --json` on the parent lists the wreck as `[diagnostic: corrupt]` and answers; no warning is logged."""
    home, cwd = tmp_path / "home", tmp_path / "work"
    cwd.mkdir()
    asyncio.run(_seed_diagnostic_home(home, cwd))
    folder = SNAPSHOTS / "subagent-diagnostic"
    command = [
        sys.executable,
        "-c",
        "from dsh.cli.main import main; main()",
        "-v",
        "--home",
        str(home),
        "run",
        "--session",
        DIAGNOSTIC_PARENT,
        "--script",
        str(folder / "script.json"),
        "--json",
        RESTART_PROMPT,
    ]
    done = subprocess.run(
        command, cwd=cwd, env=_clean_environment(), capture_output=True, text=True, timeout=_GUARD_S, check=False
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    last = records[-1]
    assert {key: last[key] for key in ("type", "sessionId", "output")} == {
        "type": "result",
        "sessionId": DIAGNOSTIC_PARENT,
        "output": "The stored subagent is unreadable. PARENT_DONE",
    }
    loud = [line for line in done.stderr.splitlines() if _LOG_LINE.match(line)]
    assert loud == []
    assert "Traceback" not in done.stderr
    log = asyncio.run(stored_log(home / "sessions", DIAGNOSTIC_PARENT))
    assert f"{DIAGNOSTIC_CHILD} [diagnostic: corrupt]" in json.dumps(log, ensure_ascii=False)
    paths = {str(home): "{{home}}", str(cwd): "{{cwd}}"}
    normalized = normalize_log(log, paths, keep_ids={DIAGNOSTIC_PARENT, DIAGNOSTIC_CHILD})
    assert_golden(folder / "parent.expected.jsonl", normalized)


_HOME_LINE = re.compile(r"^home: (\S+)", re.MULTILINE)


def test_demo_plain_stdout_snapshot() -> None:
    """Keyless, without `DSH_*` settings, `dsh demo --plain` exits 0 with the golden stdout (running 0, corrupt 1)."""
    unset: dict[str, str | None] = {key: None for key in os.environ if key not in _clean_environment()}
    unset.pop("DSH_SNAPSHOT", None)  # the golden's own switch
    result = runner.invoke(app, ["demo", "--plain"], env=unset)
    assert result.exit_code == 0, result.output
    found = _HOME_LINE.search(result.stdout)
    assert found is not None
    home = found.group(1)
    assert not Path(home).exists()
    live = _section(result.stdout, "== 5. Live catalog ==", "== 6.")
    outline = _table_row(live, "00000001-0000-4000-8000-000000000004")
    assert "running" in outline
    assert outline.split()[-1] == "0"  # the LOG READS column: the live rung reads no log
    cold = _section(result.stdout, "== 8. Cold catalog", "== 9.")
    sources = _table_row(cold, "00000001-0000-4000-8000-000000000003")
    assert "diagnostic" in sources
    assert "corrupt" in sources
    assert sources.split()[-1] == "1"  # exactly one log read
    stdout = normalize_text(result.stdout, {home: "{{home}}"})
    assert_golden(SNAPSHOTS / "demo-plain" / "stdout.expected.txt", stdout)


def _section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def _table_row(section: str, row_id: str) -> str:
    (row,) = [line for line in section.splitlines() if line.startswith(row_id)]
    return row


def test_a_changed_golden_fails_with_a_diff_and_refresh_rewrites_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `DSH_SNAPSHOT=refresh` a changed golden fails with a unified diff; with it the file is rewritten."""
    original = SNAPSHOTS / "subagent-list-agents" / "tool-schemas.expected.json"
    copy = tmp_path / "tool-schemas.expected.json"
    shutil.copyfile(original, copy)
    actual = original.read_text(encoding="utf-8")
    copy.write_text(actual.replace('"list_agents"', '"list_agents_changed"', 1), encoding="utf-8")
    monkeypatch.delenv("DSH_SNAPSHOT", raising=False)
    with pytest.raises(AssertionError) as failed:
        assert_golden(copy, actual)
    message = str(failed.value)
    assert "DSH_SNAPSHOT=refresh" in message
    assert '-    "name": "list_agents_changed",\n' in message
    assert '+    "name": "list_agents",\n' in message
    assert "@@" in message
    monkeypatch.setenv("DSH_SNAPSHOT", "refresh")
    assert_golden(copy, actual)
    assert copy.read_text(encoding="utf-8") == actual
    monkeypatch.delenv("DSH_SNAPSHOT")
    assert_golden(copy, actual)


def test_the_snapshot_tool_schemas_equal_the_tool_golden() -> None:
    """The snapshot's tool schemas and `tests/golden/tool_schemas.json` are the same contract, byte for byte."""
    golden = Path(__file__).resolve().parents[1] / "golden" / "tool_schemas.json"
    snapshot = SNAPSHOTS / "subagent-list-agents" / "tool-schemas.expected.json"
    assert snapshot.read_bytes() == golden.read_bytes()
