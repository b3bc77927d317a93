"""The workspace tools: `read`, `write`, `edit`, `glob`, `grep` and `bash`, confined to one folder.

Layer: tools. Their model-visible names, parameters and results are the TypeScript harness's
(docs/tools.md#workspace-tools). Every path they take is resolved inside the workspace root, symbolic
links included (`Workspace`); `bash` runs in that root under bubblewrap as the session's sandbox mode
says (`ShellRunner`). Library users opt in, with `Runtime.open(..., workspace=DIR)` or by passing
`workspace_tools(DIR)` as tools; `dsh run` and `dsh serve` give them to every agent and its
subagents. Approvals apply to them like to any tool: by default `write`, `edit` and `bash` ask.

* `_paths.py`: `Workspace` and the workspace rule.
* `_files.py`: `ReadTool`, `WriteTool`, `EditTool`.
* `_search.py`: `GlobTool`, `GrepTool` (ripgrep when on `PATH`, pure Python otherwise).
* `_shell.py`: `ShellRunner`, the process group, the output capture and the sandbox.
* `_bash.py`: `BashTool`.
"""

from __future__ import annotations

import os

from dsh.agent.tools import Tool
from dsh.config import SandboxConfig, ToolsConfig
from dsh.tools.workspace._bash import BashTool
from dsh.tools.workspace._files import EditTool, FileLimits, ReadTool, WriteTool
from dsh.tools.workspace._paths import Workspace
from dsh.tools.workspace._search import GlobTool, GrepTool
from dsh.tools.workspace._shell import SandboxSettings, ShellRunner

__all__ = [
    "WORKSPACE_TOOL_NAMES",
    "BashTool",
    "EditTool",
    "GlobTool",
    "GrepTool",
    "ReadTool",
    "SandboxSettings",
    "ShellRunner",
    "Workspace",
    "WriteTool",
    "workspace_tools",
]

WORKSPACE_TOOL_NAMES = ("bash", "edit", "glob", "grep", "read", "write")
"""The names of the workspace tools, sorted."""


def workspace_tools(
    root: str | os.PathLike[str] | Workspace,
    *,
    tools: ToolsConfig | None = None,
    sandbox: SandboxConfig | None = None,
) -> list[Tool]:
    """The six workspace tools for `root`, sorted by name.

    Args:
        root: The workspace folder (its real path is used).
        tools: The tools' limits (default: `ToolsConfig()`).
        sandbox: The sandbox settings; its `mode` is the default for calls made without an agent's
            permissions (default: `SandboxConfig()`, i.e. `workspace-write`).

    Raises:
        ConfigError: `root` is not a folder.
    """
    workspace = root if isinstance(root, Workspace) else Workspace(root)
    limits = tools or ToolsConfig()
    box = sandbox or SandboxConfig()
    runner = ShellRunner(
        workspace.root,
        SandboxSettings(network=box.network, when_unavailable=box.when_unavailable),
        max_output_bytes=limits.bash_max_output_bytes,
    )
    return [
        BashTool(
            workspace,
            runner,
            default_mode=box.mode,
            timeout_ms=limits.bash_timeout_ms,
            max_timeout_ms=limits.bash_max_timeout_ms,
        ),
        EditTool(workspace),
        GlobTool(workspace, max_results=limits.glob_max_results),
        GrepTool(workspace, max_matches=limits.grep_max_matches),
        ReadTool(workspace, FileLimits(max_lines=limits.read_max_lines, max_bytes=limits.read_max_bytes)),
        WriteTool(workspace),
    ]
