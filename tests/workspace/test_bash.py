"""The bash tool: output and exit codes, the environment, output limits, the process group and the sandbox.

Processes are checked by their host pids: after a timeout, an interrupt or the end of the command,
nothing the command started is left, sandboxed or not. Under bubblewrap a command cannot create a
file outside the workspace or open a network connection; with `sandbox = "off"` it can, and the
session log records the mode.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortController
from dsh.agent.approval import Permissions
from dsh.agent.errors import ToolError
from dsh.config import Config
from dsh.tools.workspace import SandboxSettings, ShellRunner
from tests.workspace.helpers import (
    GUARD_S,
    bash_call,
    needs_bwrap,
    result_blocks,
    result_texts,
    scripted,
    workspace_runtime,
)

MODES = [
    pytest.param("danger-full-access", id="unsandboxed"),
    pytest.param("workspace-write", id="bubblewrap", marks=needs_bwrap),
]


def _runner(workspace: Path, **settings: Any) -> ShellRunner:
    return ShellRunner(workspace, SandboxSettings(**settings), grace_s=1.0)


async def _run(runner: ShellRunner, command: str, mode: str = "danger-full-access", *, timeout_ms: int = 30_000) -> Any:
    return await runner.run(
        command, workdir=runner.root, timeout_ms=timeout_ms, mode=mode, signal_=AbortController().signal
    )


# ---------------------------------------------------------------- results


async def test_stdout_stderr_and_the_exit_code_reach_the_model(tmp_path: Path) -> None:
    """stdout, then `[stderr]` and stderr, then `[exit code: 3]`; a non-zero exit is not an errored result."""
    steps = [bash_call("echo out; echo err >&2; exit 3"), {"text": "done"}]
    async with workspace_runtime(tmp_path / "home", scripted(steps), tmp_path) as rt:
        result = await asyncio.wait_for(rt.run("run it"), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    (text,) = result_texts(events)
    assert text == "out\n[stderr]\nerr\n[exit code: 3]"
    (data,) = result_blocks(events)
    block = data["message"]["content"][0]
    assert block["isError"] is False
    assert block["output"]["exitCode"] == 3
    assert block["output"]["sandbox"]["mode"] == "workspace-write"


async def test_the_environment_has_no_dsh_variables_and_no_api_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`DSH_*` and `*_API_KEY` variables are left out of the command's environment; others stay."""
    monkeypatch.setenv("DSH_MODEL_API_KEY", "sk-dsh")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("DSH_HOME", "/somewhere")
    monkeypatch.setenv("KEEP_ME", "kept")
    result = await _run(_runner(tmp_path), "env")
    assert "KEEP_ME=kept" in result.stdout.text
    assert "TERM=dumb" in result.stdout.text
    for gone in ("sk-dsh", "sk-openai", "DSH_", "_API_KEY"):
        assert gone not in result.stdout.text


async def test_long_output_keeps_its_head_and_its_tail(tmp_path: Path) -> None:
    """Output past the limit keeps its first and last bytes and says how much was left out."""
    runner = ShellRunner(tmp_path, max_output_bytes=1000)
    result = await _run(runner, "seq 1 100000")
    text = result.stdout.text
    assert text.startswith("1\n2\n3\n")
    assert text.rstrip().endswith("99999\n100000")
    assert "bytes of output omitted" in text
    assert result.stdout.omitted_bytes > 500_000


async def test_a_timeout_is_marked_and_the_command_stopped(tmp_path: Path) -> None:
    """A command past its timeout is stopped; the result says `[timed out after 300ms]`."""
    steps = [bash_call("echo started; sleep 30", timeoutMs=300), {"text": "done"}]
    async with workspace_runtime(tmp_path / "home", scripted(steps), tmp_path, config={"sandbox": "off"}) as rt:
        result = await asyncio.wait_for(rt.run("run it"), GUARD_S)
        (text,) = result_texts(list(rt.sessions.get(result.session_id).events))  # type: ignore[union-attr]
    assert text.startswith("started\n")
    assert "[timed out after 300ms]" in text
    assert "[killed by signal: SIGTERM]" in text


# ---------------------------------------------------------------- the process group


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a host pid, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _group_of_our_child() -> set[int]:
    """The host pids of the process group our newest child session leads (the command and what it started)."""
    leaders = [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit()
        and (found := _stat(int(name))) is not None
        and found[1] == os.getpid()
        and found[2] == int(name)
    ]
    return _members(max(leaders))


def _members(group: int) -> set[int]:
    """The host pids whose process group is `group`."""
    return {
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit() and (found := _stat(int(name))) is not None and found[2] == group
    }


def _alive(pids: set[int]) -> set[int]:
    """The pids still running: a zombie (Z) or a process being reaped (X) has exited."""
    return {pid for pid in pids if (found := _stat(pid)) is not None and found[0] not in ("Z", "X", "x")}


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A named pipe in the workspace the command writes `ready` to once it has started its children."""
    path = tmp_path / "ready.fifo"
    os.mkfifo(path)
    return path


async def _read_fifo(fifo: Path) -> str:
    def read() -> str:
        with fifo.open() as pipe:
            return pipe.read()

    return await asyncio.wait_for(asyncio.to_thread(read), GUARD_S)


async def _wait_ready(fifo: Path) -> None:
    assert (await _read_fifo(fifo)).strip() == "ready"


_TREE = "sleep 1000 & sleep 1000 & (sleep 1000; true) & echo ready > ready.fifo; wait"


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_a_timeout_kills_every_process_the_command_started(tmp_path: Path, fifo: Path, mode: str) -> None:
    """After a timeout, no process of the command's group is left on the host (with and without bubblewrap)."""
    runner = _runner(tmp_path)
    running = asyncio.ensure_future(_run(runner, _TREE, mode, timeout_ms=4000))
    await _wait_ready(fifo)
    pids = _group_of_our_child()
    assert len(_alive(pids)) >= 4  # the shell and its three children, at least
    result = await asyncio.wait_for(running, GUARD_S)
    assert result.timed_out
    assert _alive(pids) == set()


@pytest.mark.parametrize("mode", MODES)
async def test_an_interrupt_kills_every_process_the_command_started(tmp_path: Path, fifo: Path, mode: str) -> None:
    """Aborting the call's signal stops the command and everything it started, and raises the abort reason."""
    runner = _runner(tmp_path)
    controller = AbortController()
    running = asyncio.ensure_future(
        runner.run(_TREE, workdir=tmp_path, timeout_ms=600_000, mode=mode, signal_=controller.signal)
    )
    await _wait_ready(fifo)
    pids = _group_of_our_child()
    assert len(_alive(pids)) >= 4
    controller.abort(RuntimeError("interrupted by the test"))
    with pytest.raises(RuntimeError, match="interrupted by the test"):
        await asyncio.wait_for(running, GUARD_S)
    assert _alive(pids) == set()


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_call_kills_every_process_the_command_started(tmp_path: Path, fifo: Path, mode: str) -> None:
    """Cancelling the tool body's task (a closing runtime) kills the command's whole group at once."""
    runner = _runner(tmp_path)
    running = asyncio.ensure_future(_run(runner, _TREE, mode, timeout_ms=600_000))
    await _wait_ready(fifo)
    pids = _group_of_our_child()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert _alive(pids) == set()


async def test_background_processes_do_not_outlive_the_command(tmp_path: Path, fifo: Path) -> None:
    """A command that leaves a child running in the background returns, and the child is killed."""
    runner = _runner(tmp_path)
    running = asyncio.ensure_future(_run(runner, "sleep 1000 & echo $$ > ready.fifo; echo done"))
    group = int(await _read_fifo(fifo))  # the shell's pid: it leads the command's process group
    pids = _members(group)
    result = await asyncio.wait_for(running, GUARD_S)
    assert result.exit_code == 0
    assert result.stdout.text.strip() == "done"
    assert _alive(pids) == set()


# ---------------------------------------------------------------- the sandbox


class _Listener:
    """A TCP socket listening on 127.0.0.1; a connection someone made waits in its backlog."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def reached(self) -> bool:
        """Whether a connection came in (the kernel completes it before the client's connect returns)."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    """A loopback TCP server for the network checks."""
    server = _Listener()
    yield server
    server.close()


def _escape_steps(outside: Path, port: int) -> list[dict[str, Any]]:
    return [
        bash_call(f"touch {outside}/created-by-bash"),
        bash_call(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"),
        {"text": "done"},
    ]


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside the workspace and outside /tmp (the sandbox's /tmp is private, so it would hide one there)."""
    path = Path(tempfile.mkdtemp(prefix="dsh-outside-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_bwrap
async def test_the_sandbox_blocks_files_outside_and_the_network(
    tmp_path: Path, listener: _Listener, outside: Path
) -> None:
    """Under workspace-write, creating a file outside the workspace and connecting out both fail."""
    workspace = tmp_path / "work"
    workspace.mkdir()
    steps = _escape_steps(outside, listener.port)
    async with workspace_runtime(tmp_path / "home", scripted(steps), workspace) as rt:
        result = await asyncio.wait_for(rt.run("escape"), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    touched, connected = result_texts(events)
    assert "[sandbox: file access denied under workspace-write mode]" in touched
    assert "[exit code: 1]" in touched
    assert "connected" not in connected.splitlines()
    assert "[exit code: 1]" in connected
    assert not (outside / "created-by-bash").exists()
    assert not listener.reached()
    modes = [event.data for event in events if event.type == "sandbox/mode"]
    assert modes == [{"mode": "workspace-write"}]


async def test_with_the_sandbox_off_both_are_possible_and_the_mode_is_logged(
    tmp_path: Path, listener: _Listener
) -> None:
    """With `sandbox = "off"` the same commands succeed, and the log records `danger-full-access`."""
    workspace, outside = tmp_path / "work", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    config = Config(home=tmp_path / "home", sandbox="off")
    permissions = Permissions.from_config(config, allow_all=True)
    steps = _escape_steps(outside, listener.port)
    async with workspace_runtime(
        tmp_path / "home", scripted(steps), workspace, permissions=permissions, config={"sandbox": "off"}
    ) as rt:
        result = await asyncio.wait_for(rt.run("escape"), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    touched, connected = result_texts(events)
    assert touched == "(no output)"
    assert connected.strip() == "connected"
    assert (outside / "created-by-bash").exists()
    assert listener.reached()
    assert [event.data for event in events if event.type == "sandbox/mode"] == [{"mode": "danger-full-access"}]


@needs_bwrap
async def test_workspace_write_keeps_the_workspace_writable_and_tmp_private(tmp_path: Path) -> None:
    """Inside the workspace a command may write; its /tmp is private (nothing reaches the host's /tmp)."""
    marker = f"dsh-private-tmp-{os.getpid()}-{id(tmp_path)}"
    result = await _run(
        _runner(tmp_path), f"echo hi > made.txt && echo x > /tmp/{marker} && cat /tmp/{marker}", "workspace-write"
    )
    assert result.exit_code == 0
    assert (tmp_path / "made.txt").read_text() == "hi\n"
    assert not Path(f"/tmp/{marker}").exists()


@needs_bwrap
async def test_read_only_mode_refuses_every_change(tmp_path: Path) -> None:
    """Under read-only, even the workspace cannot be written; the denial is marked."""
    result = await _run(_runner(tmp_path), "echo hi > made.txt", "read-only")
    assert result.exit_code == 1
    assert result.denied
    assert not (tmp_path / "made.txt").exists()


@needs_bwrap
async def test_network_can_be_allowed_inside_the_sandbox(tmp_path: Path, listener: _Listener) -> None:
    """`sandbox.network = true` keeps the network while the file system stays confined."""
    runner = _runner(tmp_path, network=True)
    result = await _run(runner, f"exec 3<>/dev/tcp/127.0.0.1/{listener.port} && echo connected", "workspace-write")
    assert result.stdout.text.strip() == "connected"
    assert listener.reached()


async def test_without_bubblewrap_the_tool_refuses_by_default(tmp_path: Path) -> None:
    """Where bubblewrap cannot run, `when_unavailable = "refuse"` fails the call with `SANDBOX_UNAVAILABLE`."""
    runner = _runner(tmp_path, bwrap=str(tmp_path / "no-such-bwrap"))
    with pytest.raises(ToolError) as raised:
        await _run(runner, "echo hi", "workspace-write")
    assert raised.value.code == "SANDBOX_UNAVAILABLE"
    assert "bubblewrap" in raised.value.message
    assert "when_unavailable" in raised.value.message


async def test_without_bubblewrap_warn_runs_unconfined_after_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`when_unavailable = "warn"` logs one WARNING and runs every command unconfined."""
    caplog.set_level(logging.WARNING, logger="dsh.tools.bash")
    runner = _runner(tmp_path, bwrap=str(tmp_path / "no-such-bwrap"), when_unavailable="warn")
    first = await _run(runner, "echo one", "workspace-write")
    second = await _run(runner, "echo two", "workspace-write")
    assert (first.stdout.text, second.stdout.text) == ("one\n", "two\n")
    assert (first.enforcement, second.enforcement) == ("none", "none")
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "WITHOUT a sandbox" in warnings[0].getMessage()
