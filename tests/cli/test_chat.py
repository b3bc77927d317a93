"""`dsh chat` on a pseudo-terminal (pexpect, 80 columns), with scripted models.

Each test starts `dsh chat` in another process, types as a person would and reads the screen: the
answer streams (text is on the screen while the turn is still held), tool calls show compactly,
a `bash` call is approved inline, a background subagent's answer and the notice reply show up with
its label, Ctrl-C interrupts only the running turn, slash commands answer, and the session id is
printed at the start and the way back at the end (`--continue` takes it up again).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pexpect
import pytest

from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from tests.cli.terminal import dsh_argv, screen, spawn, write_script

pytestmark = pytest.mark.slow

PROMPT = "you>"
_SESSION = re.compile(r"session ([0-9a-z]+) ")


def _chat(tmp_path: Path, script: Path, *extra: str) -> pexpect.spawn:
    workspace = tmp_path / "work"
    workspace.mkdir(exist_ok=True)
    argv = dsh_argv(tmp_path / "home", "chat", "--script", str(script), "--workspace", str(workspace), *extra)
    child = spawn(tmp_path, argv)
    child.expect(_SESSION)
    child.session_id = child.match.group(1)  # type: ignore[attr-defined,union-attr]
    child.expect(PROMPT)
    return child


def _leave(child: pexpect.spawn) -> list[str]:
    """Ctrl-D at the prompt; returns the screen's lines once the process has ended (exit 0).

    The last line must tell how to resume the session (it may be wider than the screen, so it is
    read from what was written, not from the screen).
    """
    child.sendeof()
    child.expect(r"to resume: (.*) chat --session ([0-9a-z]+)\r\n")
    child.resumed = child.match.group(0).strip()  # type: ignore[attr-defined,union-attr]
    assert child.match.group(2) == child.session_id  # type: ignore[attr-defined,union-attr]
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return screen("".join(child.transcript))  # type: ignore[attr-defined]


async def _stored(home: Path) -> dict[str, list[Any]]:
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        out = {}
        for record in await rt.query.list_sessions():
            out[record.id] = list((await rt.query.observe_session(record.id)).events)
        return out


def _checked(tmp_path: Path) -> dict[str, list[Any]]:
    stored = asyncio.run(_stored(tmp_path / "home"))
    for events in stored.values():
        assert_harness_shapes(events)
    return stored


def test_the_answer_streams_and_ctrl_c_interrupts_only_the_running_turn(tmp_path: Path) -> None:
    """The first chunk is on the screen while the turn is held; Ctrl-C ends that turn aborted, the next one answers."""
    script = write_script(
        tmp_path,
        {
            "main": {
                "steps": [
                    {"text": "STREAMED_FIRST_PART and the rest never comes", "chunkSize": 19, "hold": "never"},
                    {"match": {"lastUser": "again"}, "text": "SECOND_TURN_ANSWER"},
                ]
            }
        },
    )
    child = _chat(tmp_path, script)
    child.sendline("start")
    child.expect("STREAMED_FIRST_PART")
    index = child.expect([PROMPT, pexpect.TIMEOUT], timeout=1)
    assert index == 1, "the prompt came back while the turn was held"
    child.sendintr()
    child.expect(r"\(the turn was interrupted\)")
    child.expect(PROMPT)
    child.sendline("again")
    child.expect("SECOND_TURN_ANSWER")
    child.expect(PROMPT)
    _leave(child)
    (events,) = _checked(tmp_path).values()
    ends = [event.data["reason"] for event in events if event.type == "turn/end"]
    assert ends == [{"kind": "aborted", "reason": {"kind": "user"}}, {"kind": "completed"}]


def test_a_bash_call_is_shown_compactly_and_approved_inline(tmp_path: Path) -> None:
    """`→ bash <command>`, the question with the exact command, `y`, then `← ok: <first line>` and the answer."""
    script = write_script(
        tmp_path,
        {
            "main": {
                "steps": [
                    {
                        "toolCalls": [
                            {"name": "bash", "arguments": {"command": "echo hi-from-bash", "description": "Say hi"}}
                        ]
                    },
                    {"match": {"lastToolResult": "hi-from-bash"}, "text": "BASH_RAN"},
                ]
            }
        },
    )
    child = _chat(tmp_path, script)
    child.sendline("run it")
    child.expect("→ bash echo hi-from-bash")
    child.expect(r"\[main\] bash needs approval:")
    child.expect(r"\$ echo hi-from-bash")
    child.expect(r"Allow\? \[y\]es / \[n\]o / \[a\]lways allow bash:echo hi-from-bash in this session:")
    child.sendline("y")
    child.expect("← ok: hi-from-bash")
    child.expect("BASH_RAN")
    child.expect(PROMPT)
    _leave(child)
    (events,) = _checked(tmp_path).values()
    assert [event.data["outcome"] for event in events if event.type == "approval/decided"] == ["allowed-once"]


def test_a_background_subagent_shows_its_label_its_answer_and_the_notice_reply(tmp_path: Path) -> None:
    """The child's answer under its label, then the reply to its notice, printed while the prompt waits."""
    delegate = {"description": "Checker", "prompt": "Check it.", "run_in_background": True}
    script = write_script(
        tmp_path,
        {
            "main": {
                "steps": [{"toolCalls": [{"name": "agent", "arguments": delegate}]}, {"text": "STARTED_IT"}],
                "on": [{"match": {"source": "subagent-settled"}, "text": "NOTICE_REPLY"}],
            },
            "Checker": {"steps": [{"text": "CHILD_ANSWER"}]},
        },
    )
    child = _chat(tmp_path, script)
    child.sendline("delegate")
    child.expect("→ agent Checker")
    child.expect("STARTED_IT")
    child.expect('── subagent "Checker" answered:')
    child.expect("CHILD_ANSWER")
    child.expect('── main, on the notice from "Checker":')
    child.expect("NOTICE_REPLY")
    child.expect(PROMPT)
    child.sendline("/agents")
    child.expect(r"continuable\s+inactive.*Checker")
    child.expect(PROMPT)
    lines = _leave(child)
    for text in ("STARTED_IT", "CHILD_ANSWER", "NOTICE_REPLY"):
        assert sum(text in line for line in lines) == 1, (text, lines)


def test_slash_commands_answer_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    """/help lists every command; /model shows and switches; /tokens sums the usage; /history lists; /exit leaves."""
    script = write_script(tmp_path, {"main": {"steps": [{"text": "HELLO_BACK"}, {"text": "ON_THE_OTHER_MODEL"}]}})
    child = _chat(tmp_path, script)
    child.sendline("/help")
    for name in ("/agents", "/history", "/compact", "/model", "/tokens", "/exit"):
        child.expect(name)
    child.expect(PROMPT)
    child.sendline("hello")
    child.expect("HELLO_BACK")
    child.expect(PROMPT)
    child.sendline("/tokens")
    child.expect(r"tokens: 15 tokens \(in 10 · cached 0 · out 5\) \(1 requests\)")
    child.sendline("/model other-model")
    child.expect(r"model: other-model \(from the next turn\)")
    child.sendline("/history")
    child.expect("you: hello")
    child.expect("main: HELLO_BACK")
    child.sendline("/nonsense")
    child.expect("unknown command /nonsense; /help lists the commands")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_multi_line_input_and_a_paste_are_one_message_each(tmp_path: Path) -> None:
    """Alt-Enter starts a new line; a bracketed paste keeps its lines; Enter sends each as one message."""
    script = write_script(tmp_path, {"main": {"steps": [{"text": "GOT_ONE"}, {"text": "GOT_TWO"}]}})
    child = _chat(tmp_path, script)
    child.send("first line")
    child.send("\x1b\r")
    child.send("second line")
    child.send("\r")
    child.expect("GOT_ONE")
    child.expect(PROMPT)
    child.send("\x1b[200~pasted one\npasted two\x1b[201~")
    child.send("\r")
    child.expect("GOT_TWO")
    child.expect(PROMPT)
    _leave(child)
    (events,) = _checked(tmp_path).values()
    typed = [
        event.data["content"][0]["text"]
        for event in events
        if event.type == "user/message" and event.data["source"]["kind"] == "user"
    ]
    assert typed == ["first line\nsecond line", "pasted one\npasted two"]


def test_the_session_id_is_printed_and_continue_takes_it_up_again(tmp_path: Path) -> None:
    """The start names the session, the end how to resume it; `dsh chat --continue` goes on with the same one."""
    script = write_script(tmp_path, {"main": {"steps": [{"text": "FIRST_ANSWER"}]}})
    first = _chat(tmp_path, script)
    first.sendline("remember this")
    first.expect("FIRST_ANSWER")
    first.expect(PROMPT)
    _leave(first)
    session_id = first.session_id  # type: ignore[attr-defined]
    assert first.resumed == f"to resume: dsh --home {tmp_path / 'home'} chat --session {session_id}"  # type: ignore[attr-defined]
    script = write_script(tmp_path, {"main": {"steps": [{"text": "SECOND_ANSWER"}]}}, name="second.json")
    second = _chat(tmp_path, script, "--continue")
    assert second.session_id == session_id  # type: ignore[attr-defined]
    second.sendline("/history")
    second.expect("you: remember this")
    second.expect(PROMPT)
    second.sendline("go on")
    second.expect("SECOND_ANSWER")
    second.expect(PROMPT)
    _leave(second)
    (events,) = _checked(tmp_path).values()
    assert [event.data["turn"] for event in events if event.type == "turn/start"] == [1, 2]


def test_a_subagents_question_while_the_prompt_waits_is_asked_and_the_chat_goes_on(tmp_path: Path) -> None:
    """A background child's `bash` question takes the terminal from the idle prompt; after `y` it answers."""
    delegate = {"description": "Checker", "prompt": "Check it.", "run_in_background": True}
    bash = {"command": "echo child-bash", "description": "Say hi"}
    script = write_script(
        tmp_path,
        {
            "main": {
                "steps": [{"toolCalls": [{"name": "agent", "arguments": delegate}]}, {"text": "STARTED_IT"}],
                "on": [{"match": {"source": "subagent-settled"}, "text": "NOTICE_REPLY"}],
            },
            "Checker": {
                "steps": [
                    {"toolCalls": [{"name": "bash", "arguments": bash}]},
                    {"match": {"lastToolResult": "child-bash"}, "text": "CHILD_RAN_IT"},
                ]
            },
        },
    )
    child = _chat(tmp_path, script)
    child.sendline("delegate")
    child.expect("STARTED_IT")
    child.expect(r"\[Checker\] bash needs approval:")
    child.expect(r"Allow\? ")
    child.sendline("y")
    child.expect("CHILD_RAN_IT")
    child.expect("NOTICE_REPLY")
    child.expect(PROMPT)
    _leave(child)
    stored = _checked(tmp_path)
    (child_events,) = [events for events in stored.values() if any(e.type == "subagent/descriptor" for e in events)]
    assert [event.data["outcome"] for event in child_events if event.type == "approval/decided"] == ["allowed-once"]


def test_compact_summarises_the_conversation_and_the_chat_goes_on(tmp_path: Path) -> None:
    """`/compact` after two exchanges writes one compaction (the model's summary); the next turn answers."""
    script = write_script(
        tmp_path,
        {
            "main": {"steps": [{"text": "FIRST_ANSWER"}, {"text": "SECOND_ANSWER"}, {"text": "AFTER_COMPACT"}]},
            "compaction": {"on": [{"text": "## Goal\n- remember the two questions"}]},
        },
    )
    child = _chat(tmp_path, script)
    child.sendline("question one")
    child.expect("FIRST_ANSWER")
    child.expect(PROMPT)
    child.sendline("question two")
    child.expect("SECOND_ANSWER")
    child.expect(PROMPT)
    child.sendline("/compact")
    child.expect(r"compacted \d+ messages \(about [\d,]+ tokens\) into a summary of [\d,]+ characters")
    child.expect(PROMPT)
    child.sendline("question three")
    child.expect("AFTER_COMPACT")
    child.expect(PROMPT)
    _leave(child)
    (events,) = _checked(tmp_path).values()
    kinds = [event.type for event in events if event.type.startswith("compaction/")]
    assert kinds[0] == "compaction/start"
    assert kinds[-1] == "compaction/end"
    assert "compaction/summary" in kinds
    (end,) = [event for event in events if event.type == "compaction/end"]
    assert "error" not in end.data  # type: ignore[operator]
