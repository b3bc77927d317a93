"""`dsh sessions` and `dsh history`: headers only with zero log reads, one observed page, exit codes, help."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pty
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.main import get_command
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.cli.progress import spinner
from dsh.cli.sessions import decode_cursor, encode_cursor
from dsh.config import Config
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing.stored_logs import StepClock
from tests.helpers import tree_snapshot

runner = CliRunner()
GUARD_S = 60.0
"""A hang guard for the child processes, never a timing assertion."""


def _child(parent: str) -> HeaderInit:
    return HeaderInit(parent_session=parent, origin="subagent", delegation_depth=1)


async def _populate(home: Path, compression: str = "zstd") -> None:
    """P (two subagent children), Q (a turn with a failed tool call, ended by the user) and R (empty-ish)."""
    config = Config(home=home, persistence={"compression": compression})
    async with Runtime.open(config, clock=StepClock()) as rt:
        sessions = []
        for session_id in ("P", "Q", "R"):
            session = rt.sessions.create(session_id)
            sessions.append(session)
        p, q, r = sessions
        for session in (p, r):
            session.append("turn/start", {"turn": 1})
            session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        descriptor = snapshot_descriptor("continuable", provider="spawn", label="Collect sources")
        good = rt.sessions.create(
            "P-good",
            header=_child("P"),
            seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
        )
        broken = rt.sessions.create("P-broken", header=_child("P"))
        for child in (good, broken):
            child.append("turn/start", {"turn": 1})
            child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        q.append("turn/start", {"turn": 1})
        user = {
            "id": "m1",
            "role": "user",
            "content": [{"type": "text", "text": "Find the teapot\nin the attic"}],
            "source": {"kind": "user"},
        }
        q.append("user/message", user)
        q.append("step/start", {"turn": 1, "step": 1})
        call = {"type": "tool-call", "id": "call_1", "name": "lookup", "arguments": '{"q":"teapot"}'}
        source = {"kind": "model", "provider": "scripted", "model": "test"}
        assistant = {
            "id": "m2",
            "role": "assistant",
            "content": [{"type": "text", "text": "Looking."}, call],
            "source": source,
        }
        q.append("assistant/message", {"turn": 1, "step": 1, "message": assistant})
        q.append(
            "tool/call", {"turn": 1, "step": 1, "callId": "call_1", "name": "lookup", "arguments": '{"q":"teapot"}'}
        )
        block = {
            "type": "tool-result",
            "toolCallId": "call_1",
            "content": [{"type": "text", "text": "no such attic"}],
            "isError": True,
        }
        result = {"id": "m3", "role": "user", "source": {"kind": "tool", "callId": "call_1"}, "content": [block]}
        q.append("tool/result", {"turn": 1, "step": 1, "message": result})
        q.append("step/end", {"turn": 1, "step": 1})
        q.append("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
        for session in (*sessions, good, broken):
            await rt.sessions.flush(session)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A populated JSONL home."""
    target = tmp_path / "home"
    asyncio.run(_populate(target))
    return target


@pytest.fixture
def log_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every log read (inspect, read_events, prepare) any runtime in this process makes."""
    reads: Counter[str] = Counter()
    for name in ("inspect", "read_events", "prepare"):
        original = getattr(PersistenceCoordinator, name)

        def counting(self: Any, session_id: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            reads[session_id] += 1
            return _original(self, session_id, *args, **kwargs)

        monkeypatch.setattr(PersistenceCoordinator, name, counting)
    return reads


def _invoke(home: Path, *args: str) -> Any:
    return runner.invoke(app, ["--home", str(home), *args])


# ---------------------------------------------------------------- dsh sessions


def test_sessions_json_lists_headers_with_child_counts_and_zero_log_reads(home: Path, log_reads: Counter[str]) -> None:
    """`dsh sessions --json`: top-level sessions newest first with their subagent counts, and no log is read."""
    before = tree_snapshot(home)
    result = _invoke(home, "sessions", "--json")
    assert result.exit_code == 0, result.output
    assert sum(log_reads.values()) == 0
    page = json.loads(result.stdout)
    assert page["nextCursor"] is None
    assert [item["id"] for item in page["items"]] == ["R", "Q", "P"]
    by_id = {item["id"]: item for item in page["items"]}
    assert by_id["P"]["children"] == 2
    assert by_id["Q"]["children"] == 0
    assert set(by_id["P"]) == {"id", "createdAt", "isSeeded", "delegationDepth", "status", "children"}
    assert {item["status"] for item in page["items"]} == {"stored"}
    everything = json.loads(_invoke(home, "sessions", "--json", "--all").stdout)
    children = {item["id"]: item for item in everything["items"] if item.get("origin") == "subagent"}
    assert set(children) == {"P-good", "P-broken"}
    assert children["P-good"]["parentSession"] == "P"
    assert sum(log_reads.values()) == 0
    assert tree_snapshot(home) == before
    # The counter sees reads: reading a page is one observation.
    assert _invoke(home, "history", "Q").exit_code == 0
    assert log_reads["Q"] == 1


def test_sessions_pages_with_the_servers_cursor(home: Path) -> None:
    """`--limit` pages; `--cursor` continues after the page that printed it; a foreign cursor is a usage error."""
    first = json.loads(_invoke(home, "sessions", "--json", "--limit", "2").stdout)
    assert [item["id"] for item in first["items"]] == ["R", "Q"]
    cursor = first["nextCursor"]
    assert decode_cursor(cursor)[1] == "Q"
    from dsh.server.routes.sessions import decode_cursor as server_decode

    assert server_decode(cursor) == decode_cursor(cursor)
    second = json.loads(_invoke(home, "sessions", "--json", "--limit", "2", "--cursor", cursor).stdout)
    assert [item["id"] for item in second["items"]] == ["P"]
    assert second["nextCursor"] is None
    table = _invoke(home, "sessions", "--limit", "2")
    assert table.exit_code == 0
    assert f"--limit 2 --cursor {cursor}" in table.stderr
    bad = _invoke(home, "sessions", "--cursor", "not-a-cursor")
    assert bad.exit_code == 2
    assert "--cursor" in bad.stderr
    assert encode_cursor(5, "x") != encode_cursor(5, "y")


def test_sessions_table_fits_80_columns_and_never_cuts_an_id(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table shows ID, CREATED, STATUS and CHILDREN at 80 columns; ids are whole."""
    monkeypatch.setenv("COLUMNS", "80")
    result = _invoke(home, "sessions", "--all", "--plain")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "CREATED", "STATUS", "CHILDREN"]
    assert all(len(line) <= 80 for line in lines)
    ids = [line.split()[0] for line in lines[1:]]
    assert set(ids) == {"P", "Q", "R", "P-good", "P-broken"}
    p_row = next(line for line in lines if line.startswith("P "))
    assert p_row.split()[-2:] == ["stored", "2"]


def test_sessions_of_an_empty_home_say_so(tmp_path: Path) -> None:
    """An existing home without sessions prints `(no sessions yet)` (`[]` items with `--json`), exit 0."""
    assert _invoke(tmp_path, "sessions").stdout == "(no sessions yet)\n"
    assert json.loads(_invoke(tmp_path, "sessions", "--json").stdout) == {"items": [], "nextCursor": None}


# ---------------------------------------------------------------- dsh history


def test_history_shows_roles_tool_calls_results_and_a_failed_turn(home: Path) -> None:
    """A page in text: the user's lines, the assistant's text and call, the failed result, the turn's end."""
    before = tree_snapshot(home)
    result = _invoke(home, "history", "Q", "--plain")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "session Q (stored; seq 0-7)",
        "turn 1",
        "  user: Find the teapot",
        "        in the attic",
        "  assistant: Looking.",
        '  calls: lookup {"q":"teapot"}',
        "    lookup error: no such attic",
        "  turn 1 ended: aborted · user",
        "(this is the start of the session)",
    ]
    assert tree_snapshot(home) == before


def test_history_pages_backwards_with_the_hinted_before(home: Path) -> None:
    """`--limit 1` shows the newest message and hints the `--before` of the older page; `--json` is the page."""
    newest = _invoke(home, "history", "Q", "--limit", "1", "--json")
    page = json.loads(newest.stdout)
    assert page["hasMore"] is True
    assert page["sessionId"] == "Q"
    before = page["nextBeforeSeq"]
    text = _invoke(home, "history", "Q", "--limit", "1")
    assert text.stdout.splitlines()[-1] == f"older messages: dsh --home {home} history Q --before {before} --limit 1"
    older = json.loads(_invoke(home, "history", "Q", "--before", str(before), "--json").stdout)
    assert older["hasMore"] is False
    assert [event["type"] for event in older["events"]][:2] == ["turn/start", "user/message"]
    assert all(event["seq"] < before for event in older["events"])


def test_history_reads_a_subagent_child_as_an_observation(home: Path) -> None:
    """Generic history reads any session, a child without its descriptor included."""
    result = _invoke(home, "history", "P-broken", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["header"]["origin"] == "subagent"


def test_the_read_commands_open_a_store_of_uncompressed_logs_with_no_flag(tmp_path: Path) -> None:
    """`dsh sessions`, `agents`, `history` and `doctor` read a store of `session.jsonl` logs (as the TypeScript
    harness writes with compression "none") exactly as its zstd twin, with no option or variable."""
    plain_home, zstd_home = tmp_path / "plain", tmp_path / "zstd"
    asyncio.run(_populate(plain_home, "none"))
    asyncio.run(_populate(zstd_home))
    logs = sorted(path.name for path in (plain_home / "sessions").rglob("session.jsonl*"))
    assert logs == ["session.jsonl"] * 5
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    for command in (["sessions", "--json", "--all"], ["agents", "P", "--json"], ["history", "Q", "--json"]):
        plain = runner.invoke(app, ["--home", str(plain_home), *command], env=env)
        assert plain.exit_code == 0, plain.output
        assert plain.stdout == _invoke(zstd_home, *command).stdout, command
    doctor = runner.invoke(app, ["--home", str(plain_home), "doctor", "--json"], env=env)
    twin = _invoke(zstd_home, "doctor", "--json")
    assert doctor.exit_code == twin.exit_code == 7  # P-broken has no descriptor, in both stores
    problems = [p for p in json.loads(doctor.stdout)["problems"] if p.get("sessionId") == "P-broken"]
    assert [Path(p["path"]).name for p in problems] == ["session.jsonl"]


def test_unknown_ids_exit_3_for_history_and_0_with_an_empty_list_for_agents(home: Path) -> None:
    """`dsh history X` exits 3 with one line; `dsh agents X --json` exits 0 and prints `[]`."""
    missing = _invoke(home, "history", "X")
    assert missing.exit_code == 3
    assert missing.stdout == ""
    assert missing.stderr.count("\n") == 1
    assert "SESSION_QUERY_SESSION_NOT_FOUND" in missing.stderr
    listed = _invoke(home, "agents", "X", "--json")
    assert listed.exit_code == 0
    assert json.loads(listed.stdout) == []


def test_bad_page_arguments_are_usage_errors(home: Path) -> None:
    """`--limit` outside 1-200 and a negative `--before` exit 2 (usage)."""
    for args in (["history", "Q", "--limit", "0"], ["history", "Q", "--before", "-1"], ["sessions", "--limit", "201"]):
        assert _invoke(home, *args).exit_code == 2, args


# ---------------------------------------------------------------- terminals, help


def _run_with_pty_stderr(args: list[str]) -> tuple[int, str, str]:
    """Run `dsh` with stdout a pipe and stderr a pseudo-terminal; return exit code, stdout and stderr."""
    leader, follower = pty.openpty()
    argv = [sys.executable, "-c", "from dsh.cli.main import main; main()", *args]
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=env) as child:
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        out, _ = child.communicate(timeout=GUARD_S)
    os.close(leader)
    return child.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("command", [["doctor", "--json"], ["sessions", "--json"], ["history", "Q", "--json"]])
def test_json_under_a_terminal_is_one_document_with_nothing_on_stderr(home: Path, command: list[str]) -> None:
    """With a terminal on stderr, `--json` writes exactly one JSON document to stdout and no progress anywhere."""
    code, out, err = _run_with_pty_stderr(["--home", str(home), *command])
    assert code in (0, 7), err  # the home holds a child without a descriptor: doctor reports it (exit 7)
    json.loads(out)
    assert out.count("\n") == 1
    assert err == ""


def test_spinners_show_on_a_terminal_only_and_never_with_json() -> None:
    """A spinner draws on a terminal console once the delay passed, and never off a terminal or when disabled."""
    terminal = io.StringIO()
    with spinner(Console(file=terminal, force_terminal=True), "listing sessions…", delay_s=0):
        Console(file=io.StringIO()).print("work")  # the block runs; the spinner thread draws meanwhile
        import threading

        done = threading.Event()
        done.wait(0.2)
    assert "listing sessions" in terminal.getvalue()
    for console, enabled in (
        (Console(file=io.StringIO(), force_terminal=False), True),
        (Console(file=io.StringIO(), force_terminal=True), False),
    ):
        with spinner(console, "listing sessions…", enabled=enabled, delay_s=0):
            pass
        assert console.file.getvalue() == ""


def test_every_command_has_help_and_an_example() -> None:
    """Each command's help text has a summary and an `Example:` block running that command."""
    group: Any = get_command(app)
    assert {"demo", "run", "agents", "doctor", "serve", "sessions", "history"} <= set(group.commands)
    for name, command in group.commands.items():
        text = command.help or ""
        assert text.strip(), name
        assert "Example:" in text, name
        example = text.split("Example:", 1)[1].strip().splitlines()[0]
        assert example.startswith("dsh "), (name, example)
        assert f" {name} " in f" {example} ", (name, example)
        shown = runner.invoke(app, [name, "--help"])
        assert shown.exit_code == 0
        assert "Example:" in shown.stdout, name
