"""What the loop records besides the conversation: request headers, permission knobs, per-turn context.

Layer: agent (private to the loop). All three use the TypeScript harness's vocabulary
(docs/agent.md#turn-events):

* `request/header {header: {config, system?, tools?}, reason}` is the full header the next request is
  built from: the call configuration, the system prompt and the tool schemas. The first request of
  an agent writes it (`initial` on a fresh log, `resume` otherwise), later requests only when it
  changed (`change`). A resumed agent takes its system prompt back from the last one, so it goes on
  with the instructions it was given.
* `permission/preset`, `sandbox/mode` and `approval/policy` are written at the start of a turn
  whenever the agent's permissions differ from what the log says is in force; a subagent's first
  ones carry `source: "delegation"`.
* The per-turn context is a `user/message` from the `pydsh/runtime-context` plugin in the snapshot
  form: the current date and time and the permissions in force. It reaches the model as context
  without becoming part of the recorded instructions.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from dsh.agent.approval import ApprovalRule, Permissions
    from dsh.session.session import Session

__all__ = [
    "CONTEXT_PLUGIN",
    "GRANT_EVENT",
    "HeaderLog",
    "KnobLog",
    "context_message",
    "granted_rules",
]

CONTEXT_PLUGIN: Final = "pydsh/runtime-context"
"""The `plugin` of the per-turn context message's source."""

GRANT_EVENT: Final = "dsh/approval/rule"
"""The ignorable event an "always" answer writes: `{tool, pattern, action: "allow", approvalId}`."""

_SANDBOX_TEXT: Final = {
    "read-only": "Sandbox: read-only. Shell commands cannot change any file, and write and edit are refused.",
    "workspace-write": (
        "Sandbox: workspace-write. Shell commands may change files only inside the workspace and a private /tmp; "
        "the rest of the file system is read-only."
    ),
    "danger-full-access": "Sandbox: off (danger-full-access). Shell commands are not confined.",
}
_POLICY_TEXT: Final = {
    "ask": (
        "Approvals: calls that need approval (by default write, edit and bash) are shown to the user before they "
        "run. A refused call comes back as an error saying so: do not try to reach the same result another way."
    ),
    "never": (
        "Approvals: prompts are disabled in this session. Calls that need approval are refused without asking; "
        "a refusal is final."
    ),
}


# ---------------------------------------------------------------- request headers


def header_of(
    *,
    provider: str,
    model: str,
    max_tokens: int | None,
    temperature: float | None,
    system: str | None,
    tools: list[Any],
) -> dict[str, Any]:
    """The canonical header: empty `system` and `tools` are left out, as requests are built."""
    config: dict[str, Any] = {"provider": provider, "model": model}
    if temperature is not None:
        config["temperature"] = temperature
    if max_tokens is not None:
        config["maxTokens"] = max_tokens
    header: dict[str, Any] = {"config": config}
    if system:
        header["system"] = system
    if tools:
        header["tools"] = tools
    return header


class HeaderLog:
    """Writes `request/header` for one agent: at its first request, then on every change."""

    def __init__(self) -> None:
        self._last: Mapping[str, Any] | None = None
        self._written = False

    def note(self, session: Session, header: dict[str, Any]) -> None:
        """Append the header when this agent has not written one yet, or when it differs from the last."""
        if not self._written:
            reason = "initial" if _last_header(session) is None else "resume"
            session.append("request/header", {"header": header, "reason": reason})
            self._written = True
        elif self._last != header:
            session.append("request/header", {"header": header, "reason": "change"})
        self._last = header


def _last_header(session: Session) -> Mapping[str, Any] | None:
    for event in reversed(session.events):
        if event.type == "request/header":
            data = event.data
            header = data.get("header") if isinstance(data, Mapping) else None
            return header if isinstance(header, Mapping) else None
    return None


# ---------------------------------------------------------------- permission knobs


class KnobLog:
    """Keeps the log's `permission/preset`, `sandbox/mode` and `approval/policy` in step with the agent."""

    def __init__(self) -> None:
        self._folded = False
        self._preset: str | None = None
        self._sandbox: str | None = None
        self._policy: str | None = None

    def note(self, session: Session, permissions: Permissions) -> None:
        """Append the knob events whose value differs from the log's (call right after `turn/start`)."""
        if not self._folded:
            self._fold(session.events)
        extra: dict[str, Any] = {}
        if permissions.delegated and self._sandbox is None and self._policy is None:
            extra["source"] = "delegation"
        preset = permissions.preset
        if preset is not None and preset != self._preset:
            session.append("permission/preset", {"preset": preset})
            self._preset = preset
        if permissions.sandbox != self._sandbox:
            session.append("sandbox/mode", {"mode": permissions.sandbox, **extra})
            self._sandbox = permissions.sandbox
        if permissions.policy != self._policy:
            session.append("approval/policy", {"policy": permissions.policy, **extra})
            self._policy = permissions.policy

    def _fold(self, events: Sequence[Any]) -> None:
        for event in events:
            data = event.data
            if not isinstance(data, Mapping):
                continue
            if event.type == "permission/preset":
                self._preset = data.get("preset")
            elif event.type == "sandbox/mode":
                self._sandbox = data.get("mode")
            elif event.type == "approval/policy":
                self._policy = data.get("policy")
        self._folded = True


def granted_rules(session: Session) -> list[ApprovalRule]:
    """The "always" grants this session's own log records, in order."""
    from dsh.agent.approval import ApprovalRule

    out: list[ApprovalRule] = []
    events = session.events
    for index in range(session.inherited_event_count, len(events)):
        event = events[index]
        if event.type != GRANT_EVENT:
            continue
        data = event.data
        tool = data.get("tool") if isinstance(data, Mapping) else None
        pattern = data.get("pattern") if isinstance(data, Mapping) else None
        if isinstance(tool, str) and isinstance(pattern, str):
            out.append(ApprovalRule(tool, pattern, "allow"))
    return out


# ---------------------------------------------------------------- per-turn context


def context_message(
    message_id: str,
    *,
    now_ms: int,
    time_zone: str | None,
    turn: int,
    permissions: Permissions | None,
) -> dict[str, Any]:
    """The per-turn context `user/message`: the time, and the permissions when the agent has some."""
    sections = [{"name": "time-context", "text": _time_text(now_ms, time_zone, turn)}]
    if permissions is not None:
        sections.append({"name": "sandbox:policy", "text": _SANDBOX_TEXT[permissions.sandbox]})
        sections.append({"name": "approval:policy", "text": _POLICY_TEXT[permissions.policy]})
    text = "\n".join(section["text"] for section in sections)
    return {
        "id": message_id,
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "plugin", "plugin": CONTEXT_PLUGIN, "form": "snapshot", "sections": sections},
    }


def _time_text(now_ms: int, time_zone: str | None, turn: int) -> str:
    moment = datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.UTC)
    zone_name = "local time"
    if time_zone is not None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            moment = moment.astimezone(ZoneInfo(time_zone))
            zone_name = time_zone
        except (ZoneInfoNotFoundError, ValueError):
            moment = moment.astimezone()
    else:
        moment = moment.astimezone()
        zone_name = moment.tzname() or zone_name
    stamp = moment.isoformat(timespec="seconds")
    return f"Current date and time at the start of turn {turn}: {stamp} ({zone_name}, {moment.strftime('%A')})."
