"""`dsh run` asks on a real pseudo-terminal: `n` refuses, `a` allows the pattern for the session.

Each test runs `dsh run` in another process on a pseudo-terminal (pexpect) with a scripted model
whose `bash` calls need approval. With `--json` (or without a terminal) nothing is asked: the call
is refused and the model told why. A subagent's question shows the subagent's label.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from tests.workspace.helpers import GUARD_S, bash_call, call

pytestmark = pytest.mark.slow


def _script(tmp_path: Path, main: list[dict[str, Any]], **tracks: list[dict[str, Any]]) -> Path:
    agents = {"main": {"steps": main}, **{key: {"steps": steps} for key, steps in tracks.items()}}
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"version": 1, "model": "scripted-test", "agents": agents}), encoding="utf-8")
    return path


def _spawn(tmp_path: Path, script: Path, *extra: str) -> pexpect.spawn:
    workspace = tmp_path / "work"
    workspace.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }
    argv = ["-m", "dsh", "--home", str(tmp_path / "home"), "run", "Do it.", "--script", str(script)]
    argv += ["--workspace", str(workspace), *extra]
    return pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=GUARD_S, dimensions=(40, 200))


def _finish(child: pexpect.spawn) -> tuple[int, str]:
    child.expect(pexpect.EOF)
    output = child.before or ""
    child.close()
    return child.exitstatus or 0, output


async def _events(home: Path) -> dict[str, list[Any]]:
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        out = {}
        for record in await rt.query.list_sessions():
            out[record.id] = list((await rt.query.observe_session(record.id)).events)
        return out


def _checked(tmp_path: Path) -> dict[str, list[Any]]:
    stored = asyncio.run(_events(tmp_path / "home"))
    for events in stored.values():
        assert_harness_shapes(events)
    return stored


def test_n_refuses_the_call_and_the_model_sees_the_refusal(tmp_path: Path) -> None:
    """The prompt shows who asks and the exact command; `n` refuses it and the model's next step sees why."""
    script = _script(
        tmp_path, [bash_call("echo hello"), {"match": {"lastToolResult": "the user refused"}, "text": "Refused."}]
    )
    child = _spawn(tmp_path, script)
    child.expect(r"\[main\] bash needs approval:")
    child.expect(r"\$ echo hello")
    child.expect(r"Allow\? \[y\]es / \[n\]o / \[a\]lways allow bash:echo hello in this session: ")
    child.sendline("n")
    status, output = _finish(child)
    assert status == 0
    assert "Refused." in output
    (events,) = _checked(tmp_path).values()
    assert [event.data["outcome"] for event in events if event.type == "approval/decided"] == ["rejected"]


def test_a_allows_the_next_matching_call_without_asking(tmp_path: Path) -> None:
    """After `a`, the same command runs again without a second question."""
    steps = [bash_call("echo hello"), bash_call("echo hello"), {"text": "Both ran."}]
    child = _spawn(tmp_path, _script(tmp_path, steps))
    child.expect(r"Allow\? ")
    child.sendline("a")
    index = child.expect([r"Allow\? ", "Both ran."])
    assert index == 1, "a second question was asked"
    status, _ = _finish(child)
    assert status == 0
    (events,) = _checked(tmp_path).values()
    assert [event.type for event in events].count("approval/asked") == 1
    assert [event.ignorable for event in events if event.type == "dsh/approval/rule"] == [True]
    outputs = [
        event.data["message"]["content"][0]["output"]["exitCode"] for event in events if event.type == "tool/result"
    ]
    assert outputs == [0, 0]


def test_with_json_the_call_is_refused_without_a_prompt(tmp_path: Path) -> None:
    """`--json` asks nothing, even on a terminal: the call is refused as unavailable and the run goes on."""
    steps = [bash_call("echo hello"), {"match": {"lastToolResult": "needs approval"}, "text": "Could not run it."}]
    child = _spawn(tmp_path, _script(tmp_path, steps), "--json")
    status, output = _finish(child)
    assert status == 0
    assert "Allow?" not in output
    result = json.loads(output.strip().splitlines()[-1])
    assert result["output"] == "Could not run it."
    (events,) = _checked(tmp_path).values()
    assert [event.data["outcome"] for event in events if event.type == "approval/decided"] == ["unavailable"]


def test_a_childs_bash_call_asks_with_the_childs_label(tmp_path: Path) -> None:
    """A subagent's call is asked about on the same terminal, labelled with the subagent's label."""
    main = [call("agent", {"description": "Checker", "prompt": "Check."}), {"text": "Parent done."}]
    child_steps = [bash_call("echo from child"), {"text": "Child done."}]
    child = _spawn(tmp_path, _script(tmp_path, main, Checker=child_steps))
    child.expect(r"\[Checker\] bash needs approval:")
    child.expect(r"\$ echo from child")
    child.expect(r"Allow\? ")
    child.sendline("y")
    status, output = _finish(child)
    assert status == 0
    assert "Parent done." in output
    stored = _checked(tmp_path)
    (child_events,) = [events for events in stored.values() if any(e.type == "subagent/descriptor" for e in events)]
    assert [event.data["outcome"] for event in child_events if event.type == "approval/decided"] == ["allowed-once"]
