"""Helpers of the workspace-tool tests: workspaces, runtimes on scripted models, and reading results."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.approval import Permissions
from dsh.agent.ids import SequentialIds
from dsh.agent.models import ScriptedModelClient
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from dsh.testing.stored_logs import StepClock
from tests.helpers import FULL_RUN

__all__ = [
    "ALLOW_ALL",
    "GUARD_S",
    "bash_call",
    "call",
    "git_workspace",
    "invoke",
    "tools_by_name",
    "needs_bwrap",
    "needs_rg",
    "result_blocks",
    "result_texts",
    "scripted",
    "workspace_runtime",
]

GUARD_S = 60.0
"""How long a test waits for something before failing: a guard against hangs, never a timing assertion."""

ALLOW_ALL = Permissions(allow_all=True)
"""Permissions that run every call without asking (the sandbox stays `workspace-write`)."""


def _skip_unless(available: bool, reason: str) -> pytest.MarkDecorator:
    # On CI the tool is installed by `.ci/run`: a missing one fails there instead of skipping.
    return pytest.mark.skipif(not available and not FULL_RUN, reason=reason)


def _bwrap_runs() -> bool:
    binary = shutil.which("bwrap")
    if binary is None:
        return False
    argv = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc", "--unshare-net"]
    completed = subprocess.run([*argv, "--", "true"], capture_output=True, check=False)
    return completed.returncode == 0


needs_bwrap = _skip_unless(_bwrap_runs(), "bubblewrap is not installed or cannot run here (.ci/run installs it)")
needs_rg = _skip_unless(shutil.which("rg") is not None, "ripgrep is not installed (.ci/run installs it)")


def git_workspace(root: Path) -> Path:
    """A git repository at `root` (created), with a committed `README.md`."""
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
    }
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    (root / "README.md").write_text("# Project\n", encoding="utf-8")
    subprocess.run(["git", "-C", str(root), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "init"], check=True, env=env)
    return root


def call(name: str, arguments: Mapping[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """A scripted step asking for one tool call."""
    entry: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id is not None:
        entry["id"] = call_id
    return {"toolCalls": [entry]}


def bash_call(command: str, **extra: Any) -> dict[str, Any]:
    """A scripted step asking `bash` to run `command`."""
    return call("bash", {"command": command, "description": "Run a command", **extra})


def scripted(main: Sequence[Mapping[str, Any]], **tracks: Sequence[Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted client: `main` for the top-level agent, other tracks by keyword (a child's label)."""
    agents: dict[str, Any] = {"main": {"steps": list(main)}}
    agents.update({key: {"steps": list(steps)} for key, steps in tracks.items()})
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-test", "agents": agents})


@contextlib.asynccontextmanager
async def workspace_runtime(
    home: Path,
    model: ScriptedModelClient,
    workspace: Path,
    *,
    permissions: Permissions | None = ALLOW_ALL,
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[Runtime]:
    """A runtime on `home` with the workspace tools on `workspace`, deterministic ids and clock."""
    values: dict[str, Any] = {"home": home, **(config or {})}
    async with Runtime.open(
        Config(**values),
        model=model,
        ids=SequentialIds(),
        clock=StepClock(),
        workspace=workspace,
        permissions=permissions,
        **options,
    ) as rt:
        yield rt


def result_blocks(events: Sequence[SessionEvent]) -> list[Mapping[str, Any]]:
    """The `tool/result` data of `events`, in order."""
    return [event.data for event in events if event.type == "tool/result"]  # type: ignore[misc]


def result_texts(events: Sequence[SessionEvent]) -> list[str]:
    """The text each `tool/result` shows the model, in order."""
    out = []
    for data in result_blocks(events):
        block = data["message"]["content"][0]
        out.append("".join(part["text"] for part in block["content"]))
    return out


async def invoke(tool: Any, args: Mapping[str, Any], *, permissions: Permissions | None = None) -> tuple[str, Any]:
    """Run one tool outside an agent: validate `args`, execute, render; returns (text, output)."""
    from dsh.abort import AbortController
    from dsh.agent.tools import ToolContext
    from dsh.services import Services

    parsed = tool.args_model.model_validate(dict(args))
    ctx = ToolContext(
        agent=None, call_id="call-1", signal=AbortController().signal, services=Services(), permissions=permissions
    )
    output = await tool.execute(parsed, ctx)
    return "".join(block["text"] for block in tool.render(parsed, output)), output


def tools_by_name(workspace: Path, **limits: Any) -> dict[str, Any]:
    """The workspace tools of `workspace`, by name (`limits` are `ToolsConfig` fields)."""
    from dsh.config import ToolsConfig
    from dsh.tools.workspace import workspace_tools

    return {tool.name: tool for tool in workspace_tools(workspace, tools=ToolsConfig(**limits))}
