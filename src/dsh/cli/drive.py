"""What `dsh run`, `dsh send` and `dsh chat` share: the workspace, the model client, the session to go on
with, and the JSON lines of `--json`.

Layer: CLI (thin: it builds what the library needs from the flags and renders what it returns).
`--continue` picks the workspace's last session: the newest top-level session whose header records
this workspace as its `cwd` (headers only, no log read).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsh.cli.text import json_text

if TYPE_CHECKING:
    from dsh.agent.model import ModelClient
    from dsh.config import Config
    from dsh.runtime import Runtime
    from dsh.session.events import SessionEvent

__all__ = ["Work", "event_line", "last_session", "model_client", "session_hint", "work_from_flags"]


@dataclass(frozen=True, slots=True)
class Work:
    """Where the agent works and what it may do: the workspace, its instructions, the permission flags."""

    workspace: Path
    instructions: str | None
    allow: list[str]
    deny: list[str]
    allow_all: bool


def work_from_flags(
    workspace: Path | None, instructions: Path | None, allow: list[str] | None, deny: list[str] | None, allow_all: bool
) -> Work:
    """The `Work` of the flags: the workspace must be a folder, the instructions file readable.

    Raises:
        ConfigError: a workspace that is not a folder, an instructions file that cannot be read.
    """
    from dsh.errors import ConfigError

    root = Path(os.path.realpath(workspace if workspace is not None else os.getcwd()))
    if not root.is_dir():
        raise ConfigError(f"the workspace {workspace} is not a folder")
    text = None
    if instructions is not None:
        try:
            text = instructions.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read the instructions file {instructions}: {error}") from None
    return Work(root, text, list(allow or ()), list(deny or ()), allow_all)


def model_client(config: Config, script: Path | None, model_name: str | None) -> ModelClient:
    """The scripted client of `--script FILE`, else the OpenAI-compatible client of the model settings."""
    if script is not None:
        from dsh.agent.models.scripted import ScriptedModelClient

        return ScriptedModelClient.from_file(script)
    from dsh.agent.models.openai_compat import OpenAICompatibleClient, resolve_model_settings

    return OpenAICompatibleClient(resolve_model_settings(config.model, model=model_name))


async def last_session(rt: Runtime, workspace: Path) -> str:
    """The id of the workspace's last session (see the module docs).

    Raises:
        ConfigError: when the workspace has no session yet.
    """
    from dsh.errors import ConfigError

    corpus = await rt.query.list_sessions()  # newest first
    for record in corpus:
        header = record.header
        if header.origin != "subagent" and header.parent_session is None and header.cwd == str(workspace):
            return header.id
    raise ConfigError(f"no session in {workspace} yet to continue: start one without --continue")


def session_hint(command: list[str], session_id: str) -> str:
    """How to go on with a session later, e.g. `dsh chat --session ID`."""
    return " ".join([*command, "--session", session_id])


def event_line(session_id: str, event: SessionEvent) -> str | None:
    """The `--json` line of one event, or None for one the stream leaves out (streamed chunks).

    `{"type": "event", "event", "sessionId", "seq", "time", "turn"?, "step"?, "summary"?}`; a `tool/call`
    adds `callId` and its `arguments` (the parsed JSON object, or the text as the model wrote it), a
    `tool/result` adds `callId`, `isError`, the `result` text the model saw and the tool's structured
    `output` when it has one (amendment A11).
    """
    from dsh.query.summary import event_summary, is_summarised

    if not is_summarised(event):
        return None
    summary = event_summary(session_id, event)
    summary["event"] = summary.pop("type")
    record: dict[str, Any] = {"type": "event", **summary}
    data = event.data if isinstance(event.data, Mapping) else {}
    if event.type == "tool/call":
        record["callId"] = data.get("callId")
        record["arguments"] = _arguments(data.get("arguments"))
    elif event.type == "tool/result":
        record.update(_result(data))
    return json_text(record, compact=True)


def _arguments(raw: object) -> object:
    if not isinstance(raw, str):
        return raw
    import orjson

    try:
        return orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        return raw


def _result(data: Mapping[str, Any]) -> dict[str, Any]:
    from dsh.agent.messages import text_of_blocks

    message = data.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    block = content[0] if isinstance(content, list) and content and isinstance(content[0], Mapping) else {}
    inner = block.get("content")
    out: dict[str, Any] = {
        "callId": block.get("toolCallId"),
        "isError": bool(block.get("isError", False)),
        "result": text_of_blocks(inner) if isinstance(inner, list) else "",
    }
    if "output" in block:
        out["output"] = block["output"]
    return out


# The options `dsh run`, `dsh chat`, `dsh send` and `dsh compact` share (evaluated once, here: typer
# reads them from the annotations).
ScriptOption = Annotated[Path | None, typer.Option("--script", help="Answer from this scripted-model file (keyless).")]
ModelOption = Annotated[str | None, typer.Option("--model", help="The model name (overrides DSH_MODEL).")]
WorkspaceOption = Annotated[
    Path | None,
    typer.Option("--workspace", help="The folder the tools work in (default: the current folder)."),
]
InstructionsOption = Annotated[
    Path | None, typer.Option("--instructions", help="A file of instructions added to the system prompt.")
]
