"""The `bash` tool: one shell command in the workspace, sandboxed, its output and exit code returned.

Layer: tools (private to `dsh.tools.workspace`). The parameters are the TypeScript harness's
(`command`, `description`, `timeoutMs`, `workdir`); background jobs are left out, and the description
says so in the harness's words. The result text is stdout, then `[stderr]` and stderr, then the
markers the harness uses: `[sandbox: file access denied under <mode> mode]`, `[timed out after Nms]`,
`[killed by signal: SIG...]` or `[exit code: N]`. A non-zero exit is a result, not an error: the
model decides what to do with it (docs/tools.md#bash).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Final, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dsh.agent.errors import ToolError
from dsh.agent.messages import text
from dsh.agent.tools import ToolContext
from dsh.tools.workspace._files import sandbox_marker
from dsh.tools.workspace._paths import Workspace
from dsh.tools.workspace._shell import ShellResult, ShellRunner

__all__ = ["BashTool"]

_BACKGROUND: Final = "Background execution is not available; long-running commands must finish within the timeout."


class BashArgs(BaseModel):
    """`bash` arguments."""

    model_config = ConfigDict(extra="ignore")
    command: str
    description: str
    timeoutMs: float | None = Field(default=None, gt=0)  # noqa: N815 - the model-visible name
    workdir: str | None = Field(default=None, min_length=1)

    @field_validator("command", "description")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty string")
        return value


class BashTool:
    """`bash`: run a command with `bash -c` in a fresh shell in the workspace."""

    name: Final = "bash"
    args_model: Final = BashArgs
    output_schema: Final[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "exitCode": {"type": ["integer", "null"]},
            "signal": {"type": ["string", "null"]},
            "timedOut": {"type": "boolean"},
            "timeoutMs": {"type": "number"},
            "stdout": {"type": "object"},
            "stderr": {"type": "object"},
            "sandbox": {"type": "object"},
        },
        "required": ["exitCode", "signal", "timedOut", "timeoutMs", "stdout", "stderr", "sandbox"],
    }

    def __init__(
        self,
        workspace: Workspace,
        runner: ShellRunner,
        *,
        default_mode: str = "workspace-write",
        timeout_ms: int = 120_000,
        max_timeout_ms: int = 600_000,
    ) -> None:
        self.workspace = workspace
        self.runner = runner
        self.default_mode = default_mode
        self.timeout_ms = min(timeout_ms, max_timeout_ms)
        self.max_timeout_ms = max_timeout_ms
        network = (
            "Network access is available."
            if runner.settings.network
            else "Network access is off while a sandbox confines the command."
        )
        self.description = (
            "Run a bash command (`bash -c`) in the workspace and return its output. Every call starts a fresh "
            "shell: nothing (working folder, variables, functions) carries over to the next call, so pass workdir "
            "instead of using cd. stdout comes first, then stderr after a [stderr] line; a non-zero exit is "
            "reported as [exit code: N], a command stopped by its timeout as [timed out after Nms], and very long "
            "output keeps its beginning and its end. Commands run in a sandbox (the session's context says which "
            "mode): a change it blocks is reported as [sandbox: file access denied under <mode> mode], a policy "
            f"decision rather than a bug, so do not try another way. {network} {_BACKGROUND}"
        )
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "description": {
                    "type": "string",
                    "description": (
                        "What the command does, in 5-10 words, shown to the user (e.g. 'Run the unit tests')."
                    ),
                },
                "timeoutMs": {
                    "type": "number",
                    "description": (
                        f"The timeout in milliseconds (default {self.timeout_ms}, at most {max_timeout_ms}); the "
                        "command and everything it started are killed when it expires."
                    ),
                },
                "workdir": {
                    "type": "string",
                    "description": "The folder to run in, relative to the workspace root. Defaults to the root.",
                },
            },
            "required": ["command", "description"],
        }

    def _mode(self, ctx: ToolContext) -> str:
        return ctx.permissions.sandbox if ctx.permissions is not None else self.default_mode

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """The command."""
        return cast(BashArgs, args).command

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """The command as typed, with its folder when it is not the root."""
        parsed = cast(BashArgs, args)
        where = f"\n(in {parsed.workdir})" if parsed.workdir else ""
        return f"$ {parsed.command}{where}"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Run the command; returns `{exitCode, signal, timedOut, timeoutMs, stdout, stderr, sandbox}`."""
        parsed = cast(BashArgs, args)
        workdir = self.workspace.root
        if parsed.workdir is not None:
            workdir = await asyncio.to_thread(self.workspace.resolve, parsed.workdir, tool="bash")
            if not workdir.is_dir():
                raise ToolError(
                    f'bash: workdir "{parsed.workdir}" is not a folder',
                    code="FILE_NOT_REGULAR",
                    name="bash",
                    path=parsed.workdir,
                )
        timeout = self.timeout_ms if parsed.timeoutMs is None else min(int(parsed.timeoutMs), self.max_timeout_ms)
        result = await self.runner.run(
            parsed.command, workdir=Path(workdir), timeout_ms=max(timeout, 1), mode=self._mode(ctx), signal_=ctx.signal
        )
        return _output(result)

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """stdout, `[stderr]` and stderr, then the markers; `(no output)` when there was none."""
        out = cast(dict[str, Any], output)
        body = out["stdout"]["text"]
        error = out["stderr"]["text"]
        if error:
            if body and not body.endswith("\n"):
                body += "\n"
            body += f"[stderr]\n{error}"
        if not body:
            body = "(no output)"
        markers: list[str] = []
        sandbox = out["sandbox"]
        if sandbox.get("denied"):
            markers.append(sandbox_marker(sandbox["mode"]))
        if out["timedOut"]:
            markers.append(f"[timed out after {out['timeoutMs']}ms]")
        if out["signal"] is not None:
            markers.append(f"[killed by signal: {out['signal']}]")
        elif out["exitCode"] != 0:
            markers.append(f"[exit code: {out['exitCode']}]")
        if not markers:
            return [text(body)]
        if not body.endswith("\n"):
            body += "\n"
        return [text(body + "\n".join(markers))]


def _output(result: ShellResult) -> dict[str, Any]:
    return {
        "exitCode": result.exit_code,
        "signal": result.signal,
        "timedOut": result.timed_out,
        "timeoutMs": result.timeout_ms,
        "stdout": result.stdout.to_json(),
        "stderr": result.stderr.to_json(),
        "sandbox": {"mode": result.mode, "denied": result.denied, "enforcement": result.enforcement},
    }


# The public names (docs/architecture.md#public-names).
BashTool.__module__ = "dsh.tools.workspace"
