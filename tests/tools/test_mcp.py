"""MCP servers as tools, against real FastMCP servers over stdio and streamable HTTP on 127.0.0.1.

Every test runs a real `Runtime` on a temporary home with the scripted model; the servers are the
SDK-written `tests/tools/mcp_fixture_server.py`, started as the configuration says. Every event
written is checked against the harness's shapes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh import Config, Runtime
from dsh.agent.approval import Permissions
from dsh.agent.ids import SequentialIds
from dsh.agent.mcp_names import mcp_tool_name
from dsh.session.events import SessionEvent
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.stored_logs import StepClock
from tests.cli.entry import dsh_process
from tests.tools.helpers import result_text_of, scripted, tool_results

SERVER = str(Path(__file__).with_name("mcp_fixture_server.py"))
GUARD_S = 30.0


def _stdio(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER, "stdio"], "approval": "allow", **extra}


def _never_starts() -> dict[str, Any]:
    script = "import sys; print('cannot open the database', file=sys.stderr); sys.exit(3)"
    return {"command": sys.executable, "args": ["-c", script]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The fixture server over streamable HTTP on 127.0.0.1; yields its URL once it accepts connections."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + GUARD_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the MCP fixture server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(GUARD_S)


def _call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"toolCalls": [{"name": name, "arguments": dict(arguments)}]}


async def _run(home: Path, servers: Mapping[str, Any], steps: list[dict[str, Any]]) -> tuple[Any, list[SessionEvent]]:
    model = scripted({"main": {"steps": steps}})
    config = Config(home=home, mcp={"servers": dict(servers)})
    async with Runtime.open(config, model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        result = await rt.run("Use the tools.")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    model.assert_consumed()
    assert_harness_shapes(events)
    return result, events


async def test_stdio_and_http_tools_are_listed_and_called(tmp_path: Path, http_server: str) -> None:
    """A scripted agent sees both servers' tools in its request header and gets their text and structured
    results; the stdio server process is gone once the runtime closed."""
    steps = [
        _call("mcp__files__echo", {"text": "hello"}),
        _call("mcp__web__add", {"a": 2, "b": 3}),
        _call("mcp__web__forecast", {"city": "Oslo"}),
        {"text": "DONE"},
    ]
    servers = {"files": _stdio(), "web": {"url": http_server, "approval": "allow"}}
    result, events = await _run(tmp_path, servers, steps)
    assert result.output == "DONE"
    header = next(e.data for e in events if e.type == "request/header")
    offered = {tool["name"]: tool for tool in header["header"]["tools"]}  # type: ignore[index]
    assert {"mcp__files__echo", "mcp__files__die", "mcp__web__add", "mcp__web__forecast"} <= set(offered)
    assert offered["mcp__web__add"]["parameters"]["required"] == ["a", "b"]
    assert offered["mcp__files__echo"]["description"] == "Say the text back, with the server's process id."
    echo, add, forecast = tool_results(events)
    assert result_text_of(echo).startswith("echo: hello (pid ")
    assert result_text_of(add) == "5"
    assert add["message"]["content"][0]["output"]["structuredContent"] == {"result": 5}
    weather = forecast["message"]["content"][0]["output"]["structuredContent"]
    assert weather == {"city": "Oslo", "celsius": 21, "sky": "clear"}
    assert all(data["message"]["content"][0]["isError"] is False for data in (echo, add, forecast))
    # The stdio server stopped with the runtime.
    pid = int(result_text_of(echo).rsplit("pid ", 1)[1].rstrip(")"))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_http_headers_take_secrets_from_the_environment(
    tmp_path: Path, http_server: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`${NAME}` in a header is read from the environment when the server starts; a missing variable makes the
    start fail with a WARNING naming it; no log line shows a header's value."""
    monkeypatch.setenv("DSH_TEST_MCP_TOKEN", "s3cret-token")
    headers = {"Authorization": "Bearer ${DSH_TEST_MCP_TOKEN}"}
    steps = [_call("mcp__web__authorization", {}), {"text": "DONE"}]
    _result, events = await _run(
        tmp_path / "a", {"web": {"url": http_server, "headers": headers, "approval": "allow"}}, steps
    )
    [seen] = tool_results(events)
    assert result_text_of(seen) == "Bearer s3cret-token"
    missing = {"web": {"url": http_server, "headers": {"Authorization": "Bearer ${DSH_TEST_MCP_UNSET}"}}}
    with caplog.at_level(logging.WARNING, logger="dsh.tools.mcp"):
        await _run(tmp_path / "b", missing, [{"text": "no tools"}])
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "DSH_TEST_MCP_UNSET (named by headers.Authorization) is not set" in warning
    assert "s3cret-token" not in caplog.text


async def test_a_server_that_exits_mid_call_gives_an_error_and_works_on_the_next_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`die` kills the server during the call: an errored result (MCP_SERVER_UNAVAILABLE) and one WARNING;
    the next call starts a new server process and succeeds."""
    steps = [
        _call("mcp__files__echo", {"text": "before"}),
        _call("mcp__files__die", {}),
        _call("mcp__files__echo", {"text": "after"}),
        {"text": "DONE"},
    ]
    with caplog.at_level(logging.WARNING, logger="dsh.tools.mcp"):
        result, events = await _run(tmp_path, {"files": _stdio()}, steps)
    assert result.stop_reason == "completed"
    before, died, after = tool_results(events)
    assert died["message"]["content"][0]["isError"] is True
    assert died["error"] == {"name": "ToolError", "code": "MCP_SERVER_UNAVAILABLE"}
    assert "restarted on the next call" in result_text_of(died)
    assert result_text_of(after).startswith("echo: after (pid ")
    assert result_text_of(before).split("pid ")[1] != result_text_of(after).split("pid ")[1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "dsh.tools.mcp"]
    assert len(warnings) == 1
    assert "files" in warnings[0].getMessage()


async def test_a_call_past_the_call_timeout_gives_an_error_and_the_server_is_restarted(tmp_path: Path) -> None:
    """A call the server does not answer within `call_timeout_s` is an errored result; the next call runs on a
    freshly started server."""
    steps = [_call("mcp__files__hang", {"seconds": 60}), _call("mcp__files__echo", {"text": "again"}), {"text": "OK"}]
    result, events = await _run(tmp_path, {"files": _stdio(call_timeout_s=1)}, steps)
    hung, again = tool_results(events)
    assert hung["error"] == {"name": "ToolError", "code": "MCP_SERVER_UNAVAILABLE"}
    assert "no answer within 1 s" in result_text_of(hung)
    assert result_text_of(again).startswith("echo: again (pid ")
    assert result.output == "OK"


async def test_a_server_that_never_starts_warns_once_and_the_others_still_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server whose process exits at start costs one WARNING (with its stderr) and offers no tools; the
    other server's tools are offered and run."""
    steps = [{"match": {"tools": ["mcp__files__echo"]}, **_call("mcp__files__echo", {"text": "x"})}, {"text": "OK"}]
    servers = {"files": _stdio(), "broken": _never_starts()}
    with caplog.at_level(logging.WARNING, logger="dsh.tools.mcp"):
        result, events = await _run(tmp_path, servers, steps)
    assert result.output == "OK"
    header = next(e.data for e in events if e.type == "request/header")
    names = [tool["name"] for tool in header["header"]["tools"]]  # type: ignore[index]
    assert not any(name.startswith("mcp__broken__") for name in names)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert 'MCP server "broken" is unavailable' in warnings[0]
    assert "cannot open the database" in warnings[0]


async def test_errors_images_and_approvals_of_mcp_tools(tmp_path: Path) -> None:
    """A server's error result is MCP_CALL_FAILED; an image becomes a placeholder the model sees while the output
    keeps the block; a tool left at the default `ask` is not run without an approver."""
    steps = [
        _call("mcp__files__refuse", {"reason": "no"}),
        _call("mcp__files__picture", {}),
        _call("mcp__files__add", {"a": 1, "b": 1}),
        {"text": "DONE"},
    ]
    server = _stdio(approval="ask", tool_approvals={"refuse": "allow", "picture": "allow"})
    _result, events = await _run(tmp_path, {"files": server}, steps)
    refused, picture, asked = tool_results(events)
    assert refused["error"] == {"name": "ToolError", "code": "MCP_CALL_FAILED"}
    assert "refused: no" in result_text_of(refused)
    assert result_text_of(picture) == "[image: image/png, 70 bytes; not shown to this model]"
    [block] = picture["message"]["content"][0]["output"]["content"]
    assert (block["type"], block["mimeType"]) == ("image", "image/png")
    assert asked["message"]["content"][0]["isError"] is True
    assert asked["error"]["code"] == "APPROVAL_UNAVAILABLE"


def test_mcp_approvals_default_to_ask_and_follow_the_server_settings() -> None:
    """Every MCP tool asks by default; `approval` sets a server's default and `tool_approvals` beats it."""
    config = Config(
        mcp={
            "servers": {
                "a": {"command": "x"},
                "b": {"command": "x", "approval": "allow", "tool_approvals": {"drop": "deny"}},
            }
        }
    )
    permissions = Permissions.from_config(config)
    assert permissions.decide("mcp__a__read", "{}")[0] == "ask"
    assert permissions.decide("mcp__b__read", "{}")[0] == "allow"
    assert permissions.decide("mcp__b__drop", "{}")[0] == "deny"
    assert permissions.decide("read", "{}")[0] == "allow"


def test_mcp_tool_names_follow_the_harness() -> None:
    """Names are `mcp__<server>__<tool>`; invalid characters or a name past 64 get a stable hash suffix."""
    assert mcp_tool_name("github", "create_issue") == "mcp__github__create_issue"
    dotted = mcp_tool_name("web", "search.v2")
    assert dotted.startswith("mcp__web__search_v2_")
    assert len(dotted) == len("mcp__web__search_v2_") + 12
    assert dotted != mcp_tool_name("web", "search_v2")
    long = mcp_tool_name("server", "t" * 80)
    assert len(long) == 64
    assert long == mcp_tool_name("server", "t" * 80)


def test_dsh_mcp_list_shows_each_server_whether_it_starts_and_its_tools(tmp_path: Path, http_server: str) -> None:
    """`dsh mcp list --json` reports the stdio and HTTP servers with their tools and the broken one with its
    error, and exits 1 because one did not start."""
    workspace = tmp_path / "project"
    (workspace / ".dsh").mkdir(parents=True)
    files = json.dumps(sys.executable)
    (workspace / ".dsh" / "config.toml").write_text(
        f"""
[mcp.servers.files]
command = {files}
args = [{json.dumps(SERVER)}, "stdio"]

[mcp.servers.web]
url = "{http_server}"

[mcp.servers.broken]
command = {files}
args = ["-c", "import sys; sys.exit(3)"]

[mcp.servers.off]
command = "nothing"
enabled = false
"""
    )
    env = {"XDG_CONFIG_HOME": str(tmp_path / "no-user-config")}
    done = dsh_process("--home", str(tmp_path / "home"), "mcp", "list", "--json", cwd=workspace, env=env)
    assert done.returncode == 1, done.stderr
    servers = {server["name"]: server for server in json.loads(done.stdout)["servers"]}
    assert (servers["files"]["started"], servers["web"]["started"]) == (True, True)
    assert "mcp__web__forecast" in [tool["tool"] for tool in servers["web"]["tools"]]
    assert servers["web"]["transport"] == "streamable-http"
    assert servers["broken"]["started"] is False
    assert "start-up" in servers["broken"]["error"]
    assert (servers["off"]["enabled"], servers["off"]["started"]) == (False, False)
    text = dsh_process("mcp", "list", cwd=workspace, env=env)
    assert "mcp__files__echo  Say the text back" in text.stdout
    assert "broken  stdio" in text.stdout
    assert "[failed to start]" in text.stdout
