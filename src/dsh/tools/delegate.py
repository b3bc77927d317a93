"""The delegation tool `agent`: hand a self-contained task to a subagent.

Layer: tools (above `dsh.subagent`). By default the call starts a one-shot child, waits for it and
returns the child's final answer; with `run_in_background` it starts a continuable child and returns
its id at once (the parent is told when the child settles, and `send_message` continues it). The
child is created by the subagent service (`ctx.services.subagents`) with the provider and depth cap
this tool was built with; the loop has already flushed the caller's log before the body runs, so a
child never refers to a parent prefix a crash could lose (docs/agent.md#flush-points). The
parameter texts and the description are frozen by the golden schema file (docs/tools.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from pydantic import BaseModel, ConfigDict

from dsh.agent.messages import text
from dsh.agent.tools import ToolContext
from dsh.tools._context import calling_agent, subagent_service

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.subagent.providers import SubagentResult
    from dsh.subagent.runtime import SubagentRuntime

__all__ = ["DEFAULT_PROVIDER", "AgentTool", "AgentToolArgs", "SubagentStoppedError"]

DEFAULT_PROVIDER: Final = "spawn"
"""The provider children are started with unless the tool is built with another one."""

_DESCRIPTION: Final = (
    "Delegate a self-contained task to a subagent: a separate agent with its own conversation that does "
    "not see this one. By default the call waits and returns the subagent's final answer. Set "
    "run_in_background to true to start a continuable background subagent instead: the call returns its "
    "subagent id at once, you are told when it finishes, and send_message gives it more work. Use "
    "list_agents to recall the background subagents you started."
)

_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "description": {
            "type": "string",
            "description": "A short (3-5 word) label for the task, shown to the user and in list_agents.",
        },
        "prompt": {
            "type": "string",
            "description": (
                "The complete, self-contained task. The subagent does not see this conversation, so include "
                "everything it needs."
            ),
        },
        "run_in_background": {
            "type": "boolean",
            "description": (
                "Start a continuable background subagent and return its id at once instead of waiting for its "
                "final answer. Defaults to false."
            ),
        },
    },
    "required": ["description", "prompt"],
}

_OUTPUT_SCHEMA: Final[Mapping[str, Any]] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"childId": {"type": "string"}, "messageId": {"type": "string"}},
            "required": ["childId", "messageId"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "childId": {"type": "string"},
                "stopReason": {"const": "completed"},
                "output": {"type": "array", "items": {"type": "object"}},
                "structured": {"type": "object"},
            },
            "required": ["childId", "stopReason", "output"],
            "additionalProperties": False,
        },
    ]
}

_NO_OUTPUT: Final = "(no output)"


class AgentToolArgs(BaseModel):
    """`agent` arguments (lax; unknown keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    description: str
    prompt: str
    run_in_background: bool = False


class SubagentStoppedError(Exception):
    """A foreground child ended without completing; the message carries any partial output.

    Attributes:
        child_id: The child's id.
        stop_reason: How it ended (`aborted`, `max-tokens`, `refusal` or `error`).
    """

    def __init__(self, child_id: str, stop_reason: str, partial: str, detail: str | None = None) -> None:
        message = f"subagent {child_id} stopped before finishing ({stop_reason})"
        if detail:
            message = f"{message}: {detail}"
        super().__init__(f"{message}\n{partial}" if partial else message)
        self.child_id = child_id
        self.stop_reason = stop_reason


def _text_blocks(blocks: object) -> list[dict[str, Any]]:
    """The text blocks of a child's output, as plain dicts (the model sees text only)."""
    if not isinstance(blocks, list | tuple):
        return []
    return [
        text(block["text"])
        for block in blocks
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
    ]


class AgentTool:
    """`agent`: start a one-shot child and return its answer, or a continuable one and return its id.

    Args:
        max_depth: The absolute cap on a child's delegation depth (a child past it is refused with
            `subagent depth <n> exceeds maxDepth <m>`).
        provider: The subagent provider children are started with (`spawn` or `fork`).
        output_schema: An object-rooted JSON Schema every foreground child must report its result in
            (through `structured_output`); the call's output then carries the validated object as
            `structured`, and the model sees it as JSON (docs/agent.md#structured-output).
    """

    name: Final = "agent"
    description: Final = _DESCRIPTION
    parameters: Final = _PARAMETERS
    args_model: Final = AgentToolArgs
    output_schema: Final = _OUTPUT_SCHEMA

    def __init__(
        self, *, max_depth: int = 3, provider: str = DEFAULT_PROVIDER, output_schema: Mapping[str, Any] | None = None
    ) -> None:
        if type(max_depth) is not int or max_depth < 0:
            raise ValueError("subagent maxDepth must be a non-negative safe integer")
        self.max_depth = max_depth
        self.provider = provider
        self.child_output_schema = output_schema

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Start the child: in the background (return at inbox acceptance) or in the foreground (await it).

        Raises:
            RuntimeError: No calling agent.
            SubagentDepthError: The child would be deeper than `max_depth`.
            SubagentError: The service refused the start.
            SubagentStoppedError: A foreground child ended without completing.
        """
        caller = calling_agent(ctx, self.name)
        subagents = subagent_service(ctx, self.name)
        parsed = cast(AgentToolArgs, args)
        parent = cast("Agent", caller)
        if parsed.run_in_background:
            from dsh.subagent.providers import (
                ContinuableSpec,
            )  # with the first delegation (docs/architecture.md#import-cost)

            started = await subagents.start_continuable(
                ContinuableSpec(
                    parent=parent,
                    prompt=parsed.prompt,
                    label=parsed.description,
                    provider=self.provider,
                    max_depth=self.max_depth,
                    signal=ctx.signal,
                )
            )
            return {"childId": started.child_id, "messageId": started.message_id}
        return await self._run_foreground(subagents, parsed, parent, ctx)

    async def _run_foreground(
        self, subagents: SubagentRuntime, args: AgentToolArgs, parent: Agent, ctx: ToolContext
    ) -> object:
        from dsh.subagent.providers import SubagentRequest

        request = SubagentRequest(
            parent=parent,
            prompt=args.prompt,
            label=args.description,
            max_depth=self.max_depth,
            signal=ctx.signal,
            output_schema=self.child_output_schema,
        )
        run = await subagents.start(self.provider, request)
        try:
            result = await _result_or_abort(run.result, ctx)
        finally:
            # Disposing a finished run only releases its handle; an unfinished one (the call was
            # cancelled) is cancelled and waited for, so no child outlives the call that owns it.
            await run.dispose()
        blocks = _text_blocks(result.output)
        if result.stop_reason != "completed":
            detail = result.error.get("message") if result.error is not None else None
            partial = "".join(block["text"] for block in blocks)
            raise SubagentStoppedError(run.id, result.stop_reason, partial, detail if isinstance(detail, str) else None)
        out: dict[str, Any] = {"childId": run.id, "stopReason": "completed", "output": blocks}
        if result.structured is not None:
            out["structured"] = result.structured
        return out

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """`started subagent <id>` for a background child; a foreground child's answer, or `(no output)`."""
        out = cast(Mapping[str, Any], output)
        if "messageId" in out:
            return [text(f"started subagent {out['childId']}")]
        if "structured" in out:
            return [text(json.dumps(out["structured"], ensure_ascii=False, separators=(",", ":")))]
        blocks = _text_blocks(out.get("output"))
        return blocks or [text(_NO_OUTPUT)]


async def _result_or_abort(result: Awaitable[SubagentResult], ctx: ToolContext) -> SubagentResult:
    """Await the run's result, or raise the call's abort reason as soon as the signal aborts."""
    pending = asyncio.ensure_future(result)
    aborted = asyncio.ensure_future(ctx.signal.wait())
    try:
        await asyncio.wait({pending, aborted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await aborted
    if not pending.done():
        # The result future stays with the run, which `dispose()` settles; only stop waiting here.
        ctx.signal.throw_if_aborted()
    return pending.result()


# Shown under the name users import (docs/architecture.md#public-names).
AgentTool.__module__ = "dsh.tools"
SubagentStoppedError.__module__ = "dsh.tools"
