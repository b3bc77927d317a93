"""An agent that does real work: it reads a file, fixes it, runs the tests through bash and reports.

The same task runs twice: in-process on a runtime with the workspace tools, and through `dsh run
--script` in another process, where nothing can be asked on a terminal and `--allow` flags let the
needed calls through.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.approval import Permissions
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from tests.workspace.helpers import GUARD_S, bash_call, call, git_workspace, result_texts, scripted, workspace_runtime

_BUGGY = "def add(a, b):\n    return a - b\n"
_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
_PYTEST = "python -m pytest -q -p no:cacheprovider"

STEPS: list[dict[str, Any]] = [
    call("read", {"file_path": "calc.py"}),
    call("edit", {"file_path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"}),
    bash_call(_PYTEST),
    {"match": {"lastToolResult": "1 passed"}, "text": "Fixed add(): the test suite passes (1 passed)."},
]


def _project(root: Path) -> Path:
    git_workspace(root)
    (root / "calc.py").write_text(_BUGGY, encoding="utf-8")
    (root / "test_calc.py").write_text(_TEST, encoding="utf-8")
    return root


@pytest.fixture
def python_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python` on PATH is this interpreter (the one with pytest installed)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _turn_types(events: list[Any]) -> list[str]:
    return [event.type for event in events]


async def test_an_agent_reads_edits_runs_the_tests_and_answers(tmp_path: Path, python_on_path: None) -> None:
    """The agent reads calc.py, fixes it with edit, runs pytest through bash and answers; the file changed."""
    workspace = _project(tmp_path / "project")
    client = scripted(STEPS)
    async with workspace_runtime(tmp_path / "home", client, workspace) as rt:
        result = await asyncio.wait_for(rt.run("Fix calc.py so the tests pass."), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    client.assert_consumed()
    assert (result.stop_reason, result.output) == ("completed", "Fixed add(): the test suite passes (1 passed).")
    assert (workspace / "calc.py").read_text(encoding="utf-8") == "def add(a, b):\n    return a + b\n"
    calls = [event.data["name"] for event in events if event.type == "tool/call"]  # type: ignore[index]
    assert calls == ["read", "edit", "bash"]
    types = _turn_types(events)
    step = ["step/start", "assistant/message", "tool/call", "tool/result", "step/end"]
    assert types[types.index("step/start") :] == [
        "step/start",
        "user/message",
        "session/title",
        "user/message",
        "request/header",
        "request/context",
        *step[1:],
        *step,
        *step,
        "step/start",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    read, edit, bash = result_texts(events)
    assert "1: def add(a, b):\n2:     return a - b" in read
    assert "-    return a - b\n+    return a + b" in edit
    assert "1 passed" in bash
    assert "[exit code" not in bash


def test_dsh_run_does_the_same_with_allow_flags_and_no_terminal(tmp_path: Path, python_on_path: None) -> None:
    """`dsh run --script` with --allow for edit and the pytest command does the task without any prompt."""
    workspace = _project(tmp_path / "project")
    script = tmp_path / "script.json"
    agents = {"main": {"steps": STEPS}}
    script.write_text(json.dumps({"version": 1, "model": "scripted-test", "agents": agents}), encoding="utf-8")
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    argv = [sys.executable, "-m", "dsh", "--home", str(home), "run", "Fix calc.py so the tests pass."]
    argv += ["--script", str(script), "--workspace", str(workspace), "--allow", "edit", "--allow", f"bash:{_PYTEST}"]
    completed = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=GUARD_S, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "Fixed add(): the test suite passes (1 passed)."
    assert "needs approval" not in completed.stderr
    assert (workspace / "calc.py").read_text(encoding="utf-8") == "def add(a, b):\n    return a + b\n"
    events = asyncio.run(_stored(home))
    assert [event.data["name"] for event in events if event.type == "tool/call"] == ["read", "edit", "bash"]  # type: ignore[index]
    assert not any(event.type.startswith("approval/asked") for event in events)
    assert_harness_shapes(events)


async def _stored(home: Path) -> list[Any]:
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        (record,) = await rt.query.list_sessions()
        return list((await rt.query.observe_session(record.id)).events)


async def test_without_permission_to_edit_the_file_stays_unchanged(tmp_path: Path, python_on_path: None) -> None:
    """With the default rules and no approver, edit and bash are refused, the model is told, the file stays."""
    workspace = _project(tmp_path / "project")
    steps = [
        call("read", {"file_path": "calc.py"}),
        call("edit", {"file_path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"}),
        {"match": {"lastToolResult": "needs approval"}, "text": "I could not edit calc.py."},
    ]
    async with workspace_runtime(tmp_path / "home", scripted(steps), workspace, permissions=Permissions()) as rt:
        result = await asyncio.wait_for(rt.run("Fix calc.py."), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert result.output == "I could not edit calc.py."
    assert (workspace / "calc.py").read_text(encoding="utf-8") == _BUGGY
    outcome = [event.data for event in events if event.type == "approval/decided"]
    assert [data["outcome"] for data in outcome] == ["unavailable"]  # type: ignore[index]
    refused = [event.data for event in events if event.type == "tool/result"][-1]
    assert refused["error"] == {"name": "ApprovalError", "code": "APPROVAL_UNAVAILABLE"}  # type: ignore[index]
