"""Instructions: the default system prompt, and how the parts of an agent's system prompt are put together.

Layer: agent. An agent's system prompt is, in this order (docs/agent.md#instructions):

1. the base: `config.agent.system_prompt` when set, else the default prompt built here (what the
   harness is, the workspace root, how the tools the agent has and subagents are used);
2. `config.agent.instructions`;
3. the agent's own instructions (`create_agent(instructions=...)`, `dsh run --instructions FILE`);
4. the workspace's `AGENTS.md`, under a heading that names it (at most 64 KiB).

What the model was given is recorded in the session's `request/header`, and a resumed session goes
on with it. The current date and time are not part of it: they reach the model once per turn as
context (docs/agent.md#turn-events).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from dsh.session.session import Session

__all__ = [
    "AGENTS_MD",
    "MAX_AGENTS_MD_BYTES",
    "agents_md_section",
    "compose",
    "default_system_prompt",
    "read_agents_md",
    "recorded_system_prompt",
]

AGENTS_MD: Final = "AGENTS.md"
MAX_AGENTS_MD_BYTES: Final = 64 * 1024

_IDENTITY: Final = (
    "You are an agent in pydsh, a harness that records every step of this conversation in a durable session "
    "log. You work by calling the tools you are given; the user sees your answers and your tool calls."
)
_TOOL_GUIDANCE: Final = {
    "read": "read: look at a text file, numbered (use it, not cat; offset and limit page through long files).",
    "write": "write: create a file or replace all of it; read an existing file first, prefer edit for small changes.",
    "edit": "edit: replace exact text in a file; old_string must occur exactly once unless replace_all is set.",
    "glob": "glob: find files by path pattern (hidden and ignored files included).",
    "grep": "grep: search file contents with a regular expression (ignored and hidden files skipped).",
    "bash": (
        "bash: run a shell command in the workspace; every call starts a fresh shell. Check the [exit code: N] "
        "marker of each result and look into failures before moving on."
    ),
}
_APPROVALS: Final = (
    "Some calls (by default write, edit and bash) need the user's approval. A call that was refused, or that "
    "could not be approved, returns an error saying so: do not try to reach the same result another way; "
    "explain what you wanted to do instead."
)
_SUBAGENTS: Final = (
    "Subagents: the agent tool hands a self-contained task to a subagent that does not see this conversation, "
    "so the prompt must say everything it needs. Delegate work that is independent and sizeable; do small "
    "things yourself. list_agents recalls the background subagents you started, send_message gives one of them "
    "more work, interrupt_agent stops one's current turn."
)
_CLOSING: Final = (
    "Work in small, checked steps, and finish with a short answer that says what you did and what you found."
)


def default_system_prompt(tool_names: Collection[str], *, workspace: str | None) -> str:
    """The default base prompt for an agent with these tools, working in `workspace` (if any)."""
    parts = [_IDENTITY]
    if workspace is not None:
        parts.append(
            f"Workspace: {workspace}. Paths you give the file tools are taken relative to it, and a path that "
            "resolves outside it (symbolic links included) is refused. Shell commands run there."
        )
    guidance = [
        _TOOL_GUIDANCE[name] for name in ("read", "write", "edit", "glob", "grep", "bash") if name in tool_names
    ]
    if guidance:
        parts.append("Tools:\n" + "\n".join(f"- {line}" for line in guidance))
    if any(name in tool_names for name in ("write", "edit", "bash")):
        parts.append(_APPROVALS)
    if "agent" in tool_names:
        parts.append(_SUBAGENTS)
    parts.append(_CLOSING)
    return "\n\n".join(parts)


def agents_md_section(content: str) -> str:
    """The `AGENTS.md` part of a system prompt."""
    return (
        f"Instructions from {AGENTS_MD} in the workspace (follow them where they apply; the user's direct "
        f"requests take precedence):\n\n{content.strip()}"
    )


def read_agents_md(root: Path) -> str | None:
    """The workspace's `AGENTS.md` (cut at 64 KiB, with a note), or None when there is none or it is unreadable.

    Blocking: call it in a worker thread.
    """
    path = root / AGENTS_MD
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_AGENTS_MD_BYTES + 1)
    except OSError:
        return None
    text = raw[:MAX_AGENTS_MD_BYTES].decode(errors="ignore")
    if len(raw) > MAX_AGENTS_MD_BYTES:
        text += f"\n\n[{AGENTS_MD} was cut at {MAX_AGENTS_MD_BYTES} bytes]"
    return text if text.strip() else None


def compose(*parts: str | None) -> str | None:
    """The non-empty parts joined by blank lines, or None when there is none."""
    kept = [part.strip() for part in parts if part and part.strip()]
    return "\n\n".join(kept) if kept else None


def recorded_system_prompt(session: Session) -> str | None:
    """The system prompt of this session's own last `request/header` ("" when it had none); None without one.

    Inherited events (a fork's prefix) are not the session's own: a forked child composes its own prompt.
    """
    events = session.events
    for index in range(len(events) - 1, session.inherited_event_count - 1, -1):
        event = events[index]
        if event.type == "request/header":
            data = event.data
            header = data.get("header") if isinstance(data, Mapping) else None
            system = header.get("system") if isinstance(header, Mapping) else None
            return system if isinstance(system, str) else ""
    return None
