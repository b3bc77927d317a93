"""`dsh run`: one prompt on a real loop (scripted, or on the fake OpenAI server): output modes and exit codes."""

from __future__ import annotations

import asyncio
import json
import logging
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
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall, fake_usage
from tests.agent.helpers import FIRST_STEP_PROLOGUE, TOOL_STEP_THEN_ANSWER

runner = CliRunner()
KEY = "sk-cli-run-0123456789"
_GUARD_S = 60  # only guards against a hang


def _script(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"version": 1, "model": "scripted-cli", "agents": {"main": {"steps": steps}}}))
    return path


def _model_env(server: FakeOpenAIServer) -> dict[str, str]:
    return {"DSH_MODEL_BASE_URL": server.base_url, "DSH_MODEL_API_KEY": KEY, "DSH_MODEL": "fake-chat"}


async def _session_ids(home: Path) -> list[str]:
    async with Runtime.open(Config(home=home)) as rt:
        return [row.header.id for row in await rt.persistence.list()]


async def _events(home: Path, session_id: str) -> list[Any]:
    async with Runtime.open(Config(home=home)) as rt:
        return list((await rt.query.observe_session(session_id)).events)


def test_run_completes_a_turn_on_the_openai_compatible_server(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """`dsh run` on the fake server: a tool step then the answer, streamed; the log holds the loop's events in order."""
    openai_server.enqueue(
        FakeReply(tool_calls=[FakeToolCall("list_agents", '{"scope": "children"}', id="call_list")], argument_chunks=3),
        FakeReply(text="Streaming works.", chunks=4),
    )
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "hello"], env=_model_env(openai_server))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Streaming works."
    assert "list_agents" in result.stderr
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    (session_id,) = asyncio.run(_session_ids(tmp_path))
    stored = asyncio.run(_events(tmp_path, session_id))
    assert [event.type for event in stored] == TOOL_STEP_THEN_ANSWER
    assert stored[11].data["arguments"] == '{"scope": "children"}'  # type: ignore[index]
    assert stored[-1].data["reason"] == {"kind": "completed"}  # type: ignore[index]


def test_the_key_never_reaches_output_logs_or_stored_events(
    tmp_path: Path, openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 401 whose body echoes the key exits 6; the key is in no stdout, stderr, log record or stored event."""
    caplog.set_level(logging.DEBUG)
    openai_server.enqueue(FakeReply.failure(401, f"Incorrect API key provided: {KEY}"))
    result = runner.invoke(app, ["--home", str(tmp_path), "-v", "run", "hi", "--json"], env=_model_env(openai_server))
    assert result.exit_code == 6, result.output
    assert "MODEL_AUTH" in result.stderr
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["stopReason"] == "error"
    stored = asyncio.run(_events(tmp_path, last["sessionId"]))
    assert stored[-1].data["reason"]["error"]["code"] == "MODEL_AUTH"  # type: ignore[index]
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was really sent
    for shown in (result.stdout, result.stderr, caplog.text, repr([(e.type, e.data) for e in stored])):
        assert KEY not in shown


def test_run_json_prints_only_json_lines_ending_with_the_result(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """With --json every stdout line is JSON: one per event (no chunks), then the result record with the tokens."""
    openai_server.enqueue(FakeReply(text="Fine.", chunks=3, usage=fake_usage(120, 7, cached=100)))
    result = runner.invoke(app, ["--home", str(tmp_path), "run", "hi", "--json"], env=_model_env(openai_server))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    *events, last = records
    assert [record["event"] for record in events] == [*FIRST_STEP_PROLOGUE, "assistant/message", "step/end", "turn/end"]
    assert {record["type"] for record in events} == {"event"}
    tokens = {
        "inputTokens": 20,
        "outputTokens": 7,
        "cacheReadTokens": 100,
        "cacheWriteTokens": 0,
        "reasoningTokens": 0,
        "requests": 1,
    }  # `fake-chat` has no price: tokens only
    assert last == {
        "type": "result",
        "sessionId": events[0]["sessionId"],
        "output": "Fine.",
        "stopReason": "completed",
        "tokens": tokens,
    }
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
    answers = [event.data["message"]["content"] for event in child_events if event.type == "assistant/message"]
    assert answers == [[{"type": "text", "text": "OK"}]], "the child never answered"
    ends = [event.data["reason"] for event in child_events if event.type == "turn/end"]
    assert ends == [{"kind": "completed"}]
    descriptors = [event.data for event in child_events if event.type == "subagent/descriptor"]
    assert [(d["mode"], d["label"]) for d in descriptors] == [("continuable", "Check facts")]
    assert len(openai_server.requests) == 4


async def _stored_child(home: Path) -> str:
    """A parent with one settled continuable child in `home`; returns the child id."""
    from dsh.agent.models import ScriptedModelClient
    from dsh.subagent.providers import ContinuableSpec

    script = {
        "version": 1,
        "model": "scripted-cli",
        "agents": {
            "main": {"steps": [], "on": [{"match": {"source": "subagent-settled"}, "text": "NOTED"}]},
            "helper": {"steps": [{"text": "HELPED"}]},
        },
    }
    async with Runtime.open(Config(home=home), model=ScriptedModelClient.from_dict(script)) as rt:
        parent = await rt.create_agent()
        started = await rt.subagents.start_continuable(ContinuableSpec(parent=parent, prompt="help", label="helper"))
        await rt.settle(timeout=_GUARD_S)
        return started.child_id


def test_run_on_a_subagent_session_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """`dsh run --session <child>` is fenced: exit 8 with the code, and the child's log is unchanged."""
    home = tmp_path / "home"
    child_id = asyncio.run(_stored_child(home))
    before = [(event.type, event.seq) for event in asyncio.run(_events(home, child_id))]
    script = _script(tmp_path, [{"text": "never"}])
    result = runner.invoke(
        app, ["--home", str(home), "run", "hi", "--session", child_id, "--script", str(script), "--json"]
    )
    assert result.exit_code == 8, result.output
    assert "SESSION_OWNED_BY_SUBAGENT" in result.stderr
    assert result.stdout == ""
    assert [(event.type, event.seq) for event in asyncio.run(_events(home, child_id))] == before


def test_model_flag_names_the_model_on_the_server_and_in_the_log(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """`--model M` beats DSH_MODEL: the server is asked for M and the log's request/context names it."""
    openai_server.enqueue(FakeReply(text="From the other model."))
    result = runner.invoke(
        app, ["--home", str(tmp_path), "run", "hi", "--model", "other-chat", "--json"], env=_model_env(openai_server)
    )
    assert result.exit_code == 0, result.output
    assert openai_server.requests[0].body["model"] == "other-chat"
    stored = asyncio.run(_events(tmp_path, json.loads(result.stdout.splitlines()[-1])["sessionId"]))
    contexts = [event.data for event in stored if event.type == "request/context"]
    assert contexts == [{"provider": "openai-compatible", "model": "other-chat"}]


def _background_script(tmp_path: Path) -> Path:
    """A parent that starts a background child whose answer holds on a gate nobody releases."""
    arguments = {"description": "Slow helper", "prompt": "Take your time.", "run_in_background": True}
    path = tmp_path / "background.json"
    script = {
        "version": 1,
        "model": "scripted-cli",
        "agents": {
            "main": {"steps": [{"toolCalls": [{"name": "agent", "arguments": arguments}]}, {"text": "STARTED"}]},
            "Slow helper": {"steps": [{"hold": "never-released", "text": "NEVER"}]},
        },
    }
    path.write_text(json.dumps(script))
    return path


def test_no_settle_closes_at_once_and_open_child_turns_end_disposed(tmp_path: Path) -> None:
    """With --no-settle the run ends after the parent's turn; the still-running child's turn ends aborted (disposed)."""
    home = tmp_path / "home"
    script = _background_script(tmp_path)
    result = runner.invoke(app, ["--home", str(home), "run", "go", "--script", str(script), "--no-settle", "--json"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.stdout.splitlines()[-1])
    assert (last["output"], last["stopReason"]) == ("STARTED", "completed")
    (child_id,) = [session_id for session_id in asyncio.run(_session_ids(home)) if session_id != last["sessionId"]]
    child_events = asyncio.run(_events(home, child_id))
    ends = [event.data["reason"] for event in child_events if event.type == "turn/end"]
    assert ends == [{"kind": "aborted", "reason": {"kind": "disposed"}}]


def test_timeout_cancels_the_turn_and_exits_130(tmp_path: Path) -> None:
    """`--timeout S` cancels a turn still running after S seconds: it ends aborted and the exit code is 130."""
    home = tmp_path / "home"
    script = _script(tmp_path, [{"text": "this answer waits for ever", "hold": "never-released"}])
    result = runner.invoke(app, ["--home", str(home), "run", "wait", "--script", str(script), "--timeout", "0.2"])
    assert result.exit_code == 130, result.output
    assert "timed out" in result.stderr
    (session_id,) = asyncio.run(_session_ids(home))
    stored = asyncio.run(_events(home, session_id))
    assert stored[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}  # type: ignore[index]
