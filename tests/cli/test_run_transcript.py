"""`dsh run` as a person reads it: on a pseudo-terminal (80 columns) and piped.

A parent that delegates to a background child answers, the child's answer shows when it settles,
and the parent's reply to the child's notice comes labelled: each once, in order, nothing erased by
the spinner, nothing glued. The session id is on stderr; `--continue` goes on with it; `--json`
lines carry tool arguments and results; `dsh send` gives a child another turn through its parent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall
from tests.cli.terminal import GUARD_S, dsh_argv, screen, spawn, terminal_env, write_script

runner = CliRunner()
KEY = "sk-run-transcript-0123456789"

_DELEGATE = {"description": "Checker", "prompt": "Check it.", "run_in_background": True}


def _delegating_script(folder: Path) -> Path:
    """The parent starts a background child (with a word first), answers, and replies to the notice."""
    return write_script(
        folder,
        {
            "main": {
                "steps": [
                    {"text": "Delegating now.", "toolCalls": [{"name": "agent", "arguments": _DELEGATE}]},
                    {"text": "PARENT_FIRST_ANSWER"},
                ],
                "on": [{"match": {"source": "subagent-settled"}, "text": "PARENT_NOTICE_REPLY"}],
            },
            "Checker": {"steps": [{"text": "CHILD_ANSWER"}]},
        },
    )


_EXPECTED_STDOUT = [
    "Delegating now.",
    "",
    "PARENT_FIRST_ANSWER",
    "",
    '── subagent "Checker" answered:',
    "CHILD_ANSWER",
    "",
    '── main, on the notice from "Checker":',
    "PARENT_NOTICE_REPLY",
]


async def _stored(home: Path) -> dict[str, list[Any]]:
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        out = {}
        for record in await rt.query.list_sessions():
            out[record.id] = list((await rt.query.observe_session(record.id)).events)
        return out


def _run_piped(tmp_path: Path, *words: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, *dsh_argv(tmp_path / "home", "run", *words)]
    return subprocess.run(
        argv, capture_output=True, text=True, env=terminal_env(tmp_path), cwd=tmp_path, timeout=GUARD_S, check=False
    )


@pytest.mark.slow
def test_piped_answers_come_each_once_in_order_on_lines_of_their_own(tmp_path: Path) -> None:
    """Piped: the first answer, the child's answer and the labelled notice reply, each once, in order, unglued."""
    done = _run_piped(tmp_path, "Delegate", "--script", str(_delegating_script(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == _EXPECTED_STDOUT
    first = done.stderr.splitlines()[0]
    assert first.startswith("session ")
    session_id = first.split()[1]
    stored = asyncio.run(_stored(tmp_path / "home"))
    assert session_id in stored
    for events in stored.values():
        assert_harness_shapes(events)
    assert "→ agent Checker" in done.stderr


@pytest.mark.slow
def test_on_a_terminal_nothing_is_erased_and_each_answer_shows_once(tmp_path: Path) -> None:
    """On an 80-column pty: the session id, then every answer once, in order; no cursor-up erases anything."""
    child = spawn(
        tmp_path, dsh_argv(tmp_path / "home", "run", "Delegate", "--script", str(_delegating_script(tmp_path)))
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    raw = "".join(child.transcript)  # type: ignore[attr-defined]
    assert "\x1b[1A" not in raw
    assert "\x1b[A" not in raw
    lines = screen(raw)
    assert lines[0].startswith("session ")
    shown = [line for line in lines if line and not line.startswith(("session ", "→", "←"))]
    assert shown == [line for line in _EXPECTED_STDOUT if line]


@pytest.mark.slow
def test_the_spinner_never_erases_an_answer_on_a_slow_model(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """With a slow model the spinner shows between steps and turns, and the final screen still has every answer."""
    arguments = json.dumps(_DELEGATE)
    # The parent's second step, the child's answer and the notice reply may reach the server in any
    # order: their texts differ, and each must be on the screen exactly once at the end.
    openai_server.enqueue(
        FakeReply(tool_calls=[FakeToolCall("agent", arguments, id="call_bg")], delay_s=0.4),
        FakeReply(text="ANSWER_ONE", chunks=3, delay_s=0.4),
        FakeReply(text="ANSWER_TWO", chunks=3, delay_s=0.4),
        FakeReply(text="ANSWER_THREE", chunks=3, delay_s=0.4),
    )
    env = {"DSH_MODEL_BASE_URL": openai_server.base_url, "DSH_MODEL_API_KEY": KEY, "DSH_MODEL": "fake-chat"}
    child = spawn(tmp_path, dsh_argv(tmp_path / "home", "run", "Delegate"), **env)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    raw = "".join(child.transcript)  # type: ignore[attr-defined]
    assert "thinking…" in raw, "the spinner never showed"
    lines = screen(raw)
    for answer in ("ANSWER_ONE", "ANSWER_TWO", "ANSWER_THREE"):
        assert sum(answer in line for line in lines) == 1, (answer, lines)
    assert not any("thinking…" in line for line in lines), "the spinner was left on the screen"


def test_continue_goes_on_with_the_workspaces_last_session(tmp_path: Path) -> None:
    """`--continue` resumes the newest session started in the workspace: same id, the next turn number."""
    home, workspace = tmp_path / "home", tmp_path / "work"
    workspace.mkdir()
    script = write_script(tmp_path, {"main": {"steps": [{"text": "ONE"}, {"text": "TWO"}]}})
    base = ["--home", str(home), "run"]
    first = runner.invoke(app, [*base, "one", "--script", str(script), "--workspace", str(workspace)])
    assert first.exit_code == 0, first.output
    session_id = first.stderr.splitlines()[0].split()[1]
    script = write_script(tmp_path, {"main": {"steps": [{"text": "TWO"}]}})
    second = runner.invoke(
        app, [*base, "two", "--continue", "--script", str(script), "--workspace", str(workspace), "--json"]
    )
    assert second.exit_code == 0, second.output
    assert second.stderr.splitlines()[0] == f"session {session_id}"
    records = [json.loads(line) for line in second.stdout.splitlines()]
    assert records[-1]["sessionId"] == session_id
    assert [record["turn"] for record in records if record.get("event") == "turn/start"] == [2]


def test_continue_without_a_session_in_the_workspace_is_a_clear_error(tmp_path: Path) -> None:
    """`--continue` in a workspace with no session exits 4 naming the workspace; `--session` with it is refused."""
    script = write_script(tmp_path, {"main": {"steps": [{"text": "never"}]}})
    base = ["--home", str(tmp_path / "home"), "run", "hi", "--script", str(script), "--workspace", str(tmp_path)]
    alone = runner.invoke(app, [*base, "--continue"])
    assert alone.exit_code == 4, alone.output
    assert "no session in" in alone.stderr
    both = runner.invoke(app, [*base, "--continue", "--session", "x"])
    assert both.exit_code == 4
    assert "exclude each other" in both.stderr


def test_json_lines_carry_tool_arguments_and_results(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """`--json`: a tool/call line has the parsed arguments and call id; its tool/result line the text and error flag."""
    openai_server.enqueue(
        FakeReply(tool_calls=[FakeToolCall("list_agents", '{"scope": "children"}', id="call_list")]),
        FakeReply(text="Listed."),
    )
    env = {"DSH_MODEL_BASE_URL": openai_server.base_url, "DSH_MODEL_API_KEY": KEY, "DSH_MODEL": "fake-chat"}
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "hi", "--json"], env=env)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    (call,) = [record for record in records if record.get("event") == "tool/call"]
    (answer,) = [record for record in records if record.get("event") == "tool/result"]
    assert (call["callId"], call["arguments"], call["summary"]) == (
        "call_list",
        {"scope": "children"},
        {"name": "list_agents"},
    )
    assert (answer["callId"], answer["isError"]) == ("call_list", False)
    assert answer["result"] == "(no subagents)"


def _send_setup(tmp_path: Path) -> tuple[Path, str, str]:
    """A parent with one settled background child, made by `dsh run`; returns the home, parent and child ids."""
    done = _run_piped(tmp_path, "Delegate", "--script", str(_delegating_script(tmp_path)))
    assert done.returncode == 0, done.stderr
    parent_id = done.stderr.splitlines()[0].split()[1]
    (child_id,) = [key for key in asyncio.run(_stored(tmp_path / "home")) if key != parent_id]
    return tmp_path / "home", parent_id, child_id


@pytest.mark.slow
def test_send_gives_a_child_another_turn_through_its_parent(tmp_path: Path) -> None:
    """`dsh send CHILD MSG`: the child answers (shown), then the parent replies to its notice (labelled)."""
    home, parent_id, child_id = _send_setup(tmp_path)
    script = write_script(
        tmp_path,
        {
            "main": {"steps": [], "on": [{"match": {"source": "subagent-settled"}, "text": "PARENT_THANKS"}]},
            "Checker": {"steps": [{"match": {"lastUser": "check again"}, "text": "CHILD_SECOND_ANSWER"}]},
        },
        name="send.json",
    )
    result = runner.invoke(app, ["--home", str(home), "send", child_id, "check again", "--script", str(script)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        '── subagent "Checker" answered:',
        "CHILD_SECOND_ANSWER",
        "",
        '── main, on the notice from "Checker":',
        "PARENT_THANKS",
    ]
    stored = asyncio.run(_stored(home))
    sources = [e.data["source"] for e in stored[child_id] if e.type == "user/message"]  # type: ignore[index]
    assert {"kind": "coordinator", "form": "relay", "senderSessionId": parent_id} in sources
    for events in stored.values():
        assert_harness_shapes(events)


@pytest.mark.slow
def test_send_refuses_a_top_level_session_and_an_unknown_id(tmp_path: Path) -> None:
    """`dsh send` to a top-level session exits 8 (NOT_RESUMABLE); to an unknown id exits 3 (SESSION_NOT_FOUND)."""
    home, parent_id, _ = _send_setup(tmp_path)
    script = write_script(tmp_path, {"main": {"steps": []}}, name="none.json")
    top = runner.invoke(app, ["--home", str(home), "send", parent_id, "hi", "--script", str(script)])
    assert top.exit_code == 8, top.output
    assert "NOT_RESUMABLE" in top.stderr
    unknown = runner.invoke(app, ["--home", str(home), "send", "no-such-child", "hi", "--script", str(script)])
    assert unknown.exit_code == 3, unknown.output
    assert "SESSION_NOT_FOUND" in unknown.stderr
