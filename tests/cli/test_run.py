"""`dsh run`: one prompt on a real loop (scripted, or on the fake OpenAI server): output modes and exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall

runner = CliRunner()
KEY = "sk-cli-run-0123456789"
_GUARD_S = 60  # only guards against a hang


def _script(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"version": 1, "model": "scripted-cli", "agents": {"main": {"steps": steps}}}))
    return path


def _model_env(server: FakeOpenAIServer) -> dict[str, str]:
    return {"DSH_MODEL_BASE_URL": server.base_url, "DSH_MODEL_API_KEY": KEY, "DSH_MODEL": "fake-chat"}


async def _events(home: Path, session_id: str) -> list[Any]:
    async with Runtime.open(Config(home=home)) as rt:
        return list((await rt.query.observe_session(session_id)).events)


def test_run_completes_a_turn_on_the_openai_compatible_server(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """`dsh run` against the fake server streams the answer and leaves the loop's events in the log."""
    openai_server.enqueue(FakeReply(text="Streaming works.", chunks=4))
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "hello"], env=_model_env(openai_server))
    assert result.exit_code == 0, result.output
    assert "Streaming works." in result.stdout
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_run_json_prints_only_json_lines_ending_with_the_result(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """With --json every stdout line is JSON: one per event (no chunks), then the result record."""
    openai_server.enqueue(FakeReply(text="Fine.", chunks=3))
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "hi", "--json"], env=_model_env(openai_server))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    *events, last = records
    assert [record["event"] for record in events] == [
        "turn/start",
        "step/start",
        "user/message",
        "request/context",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    assert {record["type"] for record in events} == {"event"}
    assert last == {"type": "result", "sessionId": events[0]["sessionId"], "output": "Fine.", "stopReason": "completed"}
    stored = asyncio.run(_events(tmp_path, last["sessionId"]))
    assert [event.type for event in stored] == [record["event"] for record in events]


def test_run_with_a_script_runs_keyless(tmp_path: Path) -> None:
    """`--script FILE` answers from the scripted model without any key."""
    script = _script(tmp_path, [{"text": "SCRIPTED_OK"}])
    env = {"DEEPSEEK_API_KEY": "", "DSH_MODEL_API_KEY": ""}
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "run", "hi", "--script", str(script)], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "SCRIPTED_OK"


def test_a_script_mismatch_exits_with_the_model_code_and_its_message(tmp_path: Path) -> None:
    """A scripted step that does not match the prompt exits 6 and prints the mismatch message."""
    script = _script(tmp_path, [{"match": {"lastUser": "expected words"}, "text": "never"}])
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "run", "something else", "--script", str(script)])
    assert result.exit_code == 6
    assert "SCRIPT_MISMATCH" in result.stderr
    assert 'lastUser should contain "expected words", got "something else"' in result.stderr


def test_without_a_key_run_exits_4_with_a_hint_and_no_traceback(tmp_path: Path) -> None:
    """No key and no script: exit 4, a hint naming DEEPSEEK_API_KEY, DSH_MODEL_API_KEY and `dsh demo`, no traceback."""
    env = {"DEEPSEEK_API_KEY": "", "DSH_MODEL_API_KEY": "", "DSH_MODEL_BASE_URL": ""}
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "hi"], env=env)
    assert result.exit_code == 4
    for hint in ("DEEPSEEK_API_KEY", "DSH_MODEL_API_KEY", "dsh demo"):
        assert hint in result.stderr
    assert "Traceback" not in result.output


def test_run_continues_a_session_with_the_next_turn_number(tmp_path: Path) -> None:
    """`--session ID` resumes the stored session; the new turn is numbered after the old ones."""
    script = _script(tmp_path, [{"text": "first"}, {"text": "second"}])
    home = tmp_path / "home"
    first = runner.invoke(app, ["--home", str(home), "run", "one", "--script", str(script), "--json"])
    session_id = json.loads(first.stdout.splitlines()[-1])["sessionId"]
    script = _script(tmp_path, [{"text": "second"}])
    second = runner.invoke(
        app, ["--home", str(home), "run", "two", "--script", str(script), "--session", session_id, "--json"]
    )
    assert second.exit_code == 0, second.output
    starts = [json.loads(line) for line in second.stdout.splitlines() if '"turn/start"' in line]
    assert [record["turn"] for record in starts] == [2]


@pytest.mark.slow
def test_sigint_cancels_the_turn_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C during a running `dsh run` ends the turn aborted and exits 130."""
    script = _script(tmp_path, [{"text": "this answer waits for ever", "hold": "never-released"}])
    home = tmp_path / "home"
    argv = [sys.executable, "-c", "from dsh.cli.main import main; main()"]
    argv += ["--home", str(home), "run", "wait", "--script", str(script), "--json"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as child:
        assert child.stdout is not None
        session_id = None
        for line in child.stdout:
            record = json.loads(line)
            session_id = record["sessionId"]
            if record.get("event") == "request/context":
                break
        child.send_signal(signal.SIGINT)
        rest, errors = child.communicate(timeout=_GUARD_S)
    assert child.returncode == 130, errors
    assert "interrupted" in errors
    assert session_id is not None
    stored = asyncio.run(_events(home, session_id))
    assert stored[-1].type == "turn/end"
    assert stored[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}  # type: ignore[index]
    assert json.loads(rest.splitlines()[-1])["stopReason"] == "aborted"


def test_run_delegates_to_a_background_child_that_answers_and_is_listed(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """On the fake server, a model that calls `agent` in the background starts a child that answers and is listed."""
    arguments = json.dumps({"description": "Check facts", "prompt": "Reply OK.", "run_in_background": True})
    # The parent's second step, the child's answer and the parent's notice turn may reach the server
    # in any order, so those three replies are interchangeable.
    openai_server.enqueue(
        FakeReply(tool_calls=[FakeToolCall("agent", arguments, id="call_bg")]),
        FakeReply(text="OK"),
        FakeReply(text="OK"),
        FakeReply(text="OK"),
    )
    env = _model_env(openai_server)
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "delegate it", "--json"], env=env)
    assert result.exit_code == 0, result.output
    parent_id = json.loads(result.stdout.splitlines()[-1])["sessionId"]
    listed = runner.invoke(app, ["--home", str(tmp_path), "agents", parent_id, "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert len(rows) == 1
    row = rows[0]
    assert (row["kind"], row["mode"], row["label"], row["activity"]) == (
        "child",
        "continuable",
        "Check facts",
        "inactive",
    )
    child_events = asyncio.run(_events(tmp_path, row["id"]))
    answers = [event for event in child_events if event.type == "assistant/message"]
    assert answers, "the child never answered"
    assert len(openai_server.requests) == 4
