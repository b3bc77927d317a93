"""Approvals: which tool calls run, which are refused, and who is asked about the rest.

Layer: agent. The model follows the TypeScript harness's (docs/tools.md#approvals): a session has an
approval policy (`ask` or `never`) and a sandbox mode (`read-only`, `workspace-write`,
`danger-full-access`), recorded as `approval/policy` and `sandbox/mode` events, with a
`permission/preset` when the pair is one of the harness's presets. On top, pydsh decides each call
by rules over the tool's name and the call's *subject* (the command of a `bash` call, the path of a
file tool, the compact JSON arguments of any other tool):

* a matching `deny` rule refuses the call, whatever else matches;
* otherwise the first matching `allow` or `ask` rule decides, in the order command-line flags,
  grants made during this session ("always"), configured rules;
* otherwise the defaults: `write`, `edit`, `bash` and every MCP tool (`mcp__...`) ask, every other
  tool is allowed;
* `allow_all` turns every remaining `ask` into `allow`.

An `ask` under the `never` policy is rejected without asking anyone. Otherwise the question goes to
the runtime's `ApprovalBroker`: to its answerer (the terminal prompt of `dsh run`), or, when remote
decisions are enabled (`dsh serve`), it waits as a pending request until a decision arrives or its
time runs out; with neither, the answer is `unavailable` and the call does not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import glob
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from dsh.abort import AbortSignal
from dsh.agent.errors import ApprovalError
from dsh.agent.mcp_names import MCP_TOOL_PREFIX, mcp_tool_name
from dsh.config import ApprovalPolicy, RuleAction, SandboxMode

if TYPE_CHECKING:
    from dsh.config import Config

__all__ = [
    "APPROVAL_OUTCOMES",
    "DEFAULT_ASK_TOOLS",
    "PRESETS",
    "Answerer",
    "ApprovalAnswer",
    "ApprovalBroker",
    "ApprovalDecision",
    "ApprovalOutcome",
    "ApprovalRequest",
    "ApprovalRule",
    "Permissions",
    "mcp_rules",
    "suggested_pattern",
]

_log = logging.getLogger("dsh.agent.approval")

ApprovalAnswer = Literal["allow", "always", "deny"]
"""What a person answers: allow this call, allow calls like it for the rest of the session, or refuse."""

ApprovalOutcome = Literal["allowed-once", "rejected", "cancelled", "unavailable"]
"""The harness's outcome vocabulary of an `approval/decided` event."""

APPROVAL_OUTCOMES: Final[tuple[ApprovalOutcome, ...]] = get_args(ApprovalOutcome)

DEFAULT_ASK_TOOLS: Final = frozenset({"bash", "edit", "write"})
"""The tools that ask by default, besides every MCP tool; the others are allowed unless a rule says otherwise."""


PRESETS: Final[dict[str, tuple[SandboxMode, ApprovalPolicy]]] = {
    "workspace-write": ("workspace-write", "ask"),
    "danger-full-access": ("danger-full-access", "never"),
}
"""The harness's default presets: a name for a sandbox mode and an approval policy together."""

_ACTIONS: Final = frozenset(get_args(RuleAction))


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """A rule: a tool name (shell wildcards; `*` for every tool), a pattern over the subject, an action."""

    tool: str
    pattern: str
    action: RuleAction

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ApprovalError(f"unknown rule action {self.action!r}", code="APPROVAL_RULE_DENIED")

    @classmethod
    def parse(cls, spec: str, action: RuleAction) -> ApprovalRule:
        """`TOOL` or `TOOL:PATTERN` (`bash:pytest *`, `write:docs/*`, `*`) as a rule with `action`.

        Raises:
            ConfigError: An empty tool name.
        """
        from dsh.errors import ConfigError

        tool, sep, pattern = spec.partition(":")
        tool = tool.strip()
        if not tool:
            raise ConfigError(f"invalid rule {spec!r}: expected TOOL or TOOL:PATTERN")
        return cls(tool, pattern if sep else "*", action)

    def matches(self, tool: str, subject: str) -> bool:
        """Whether the rule covers a call of `tool` about `subject` (whole-string wildcard matches)."""
        return fnmatch.fnmatchcase(tool, self.tool) and fnmatch.fnmatchcase(subject, self.pattern)

    @property
    def spec(self) -> str:
        """`TOOL:PATTERN`, the form `--allow` and `--deny` take."""
        return f"{self.tool}:{self.pattern}"


@dataclass(frozen=True, slots=True)
class Permissions:
    """What an agent may do without asking, and how it asks.

    Attributes:
        policy: `ask` or `never` (an `ask` is rejected without asking).
        sandbox: The sandbox mode of `bash` and of the file tools' writes.
        flag_rules: Rules from command-line flags (`--deny`, `--allow`); they rank first.
        rules: Configured rules; they rank after the flags and the session's grants.
        allow_all: Turn every `ask` into `allow` (deny rules still apply).
        delegated: Inherited from a parent agent at delegation (recorded as `source: "delegation"`).
    """

    policy: ApprovalPolicy = "ask"
    sandbox: SandboxMode = "workspace-write"
    flag_rules: tuple[ApprovalRule, ...] = ()
    rules: tuple[ApprovalRule, ...] = ()
    allow_all: bool = False
    delegated: bool = False

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        allow_all: bool | None = None,
    ) -> Permissions:
        """The permissions of `config`, with `--allow`/`--deny` specs ranked before the configured rules."""
        flags = [ApprovalRule.parse(spec, "deny") for spec in deny] + [
            ApprovalRule.parse(spec, "allow") for spec in allow
        ]
        rules = [ApprovalRule(rule.tool, rule.pattern, rule.action) for rule in config.approvals.rules]
        rules += mcp_rules(config)
        return cls(
            policy=config.approvals.policy,
            sandbox=config.sandbox.mode,
            flag_rules=tuple(flags),
            rules=tuple(rules),
            allow_all=config.approvals.allow_all if allow_all is None else allow_all,
        )

    @property
    def preset(self) -> str | None:
        """The harness preset this sandbox mode and policy make, or None when they make none."""
        for name, pair in PRESETS.items():
            if pair == (self.sandbox, self.policy):
                return name
        return None

    def decide(
        self, tool: str, subject: str, granted: Sequence[ApprovalRule] = ()
    ) -> tuple[RuleAction, ApprovalRule | None]:
        """The action for a call of `tool` about `subject`, and the rule that decided (None for a default).

        `granted` are the session's "always" grants. A deny rule beats everything; then the first
        matching rule among the flags, the grants and the configured rules decides; then the defaults.
        """
        ordered = (*self.flag_rules, *granted, *self.rules)
        for rule in ordered:
            if rule.action == "deny" and rule.matches(tool, subject):
                return "deny", rule
        for rule in ordered:
            if rule.matches(tool, subject):
                return ("allow" if self.allow_all else rule.action), rule
        if (tool in DEFAULT_ASK_TOOLS or tool.startswith(MCP_TOOL_PREFIX)) and not self.allow_all:
            return "ask", None
        return "allow", None

    def for_child(self) -> Permissions:
        """A subagent's permissions: these, marked delegated. Grants of the parent's session stay there."""
        return dataclasses.replace(self, delegated=True)


def mcp_rules(config: Config) -> list[ApprovalRule]:
    """The rules an MCP server's `tool_approvals` and `approval` settings make, tool rules first.

    They rank after the configured `approvals.rules`. A server left at `ask` needs no rule: every
    `mcp__` tool asks by default (docs/tools.md#mcp-servers).
    """
    out: list[ApprovalRule] = []
    for name, server in config.mcp.servers.items():
        out += [ApprovalRule(mcp_tool_name(name, tool), "*", action) for tool, action in server.tool_approvals.items()]
        if server.approval != "ask":
            out.append(ApprovalRule(glob.escape(f"{MCP_TOOL_PREFIX}{name}__") + "*", "*", server.approval))
    return out


def suggested_pattern(subject: str) -> str:
    """The pattern an "always" answer grants: exactly this subject (wildcard characters escaped)."""
    return glob.escape(subject)


# ---------------------------------------------------------------- requests and the broker


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One question: may this call run?

    Attributes:
        id: Pairs the `approval/asked` and `approval/decided` events and names the request on the HTTP API.
        session_id: The asking agent's session.
        label: The asking agent's label (`main`, or a subagent's label).
        tool: The tool's name.
        subject: What the rules look at (the command, the path ...).
        preview: The exact command or change, as a person should see it.
        pattern: The pattern an "always" answer would grant.
        call_id: The model's id of the tool call.
        created_at_ms: When the question was asked (epoch ms).
    """

    id: str
    session_id: str
    label: str
    tool: str
    subject: str
    preview: str
    pattern: str
    call_id: str
    created_at_ms: int

    def to_json(self) -> dict[str, Any]:
        """The wire form (camelCase)."""
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "label": self.label,
            "toolName": self.tool,
            "subject": self.subject,
            "preview": self.preview,
            "pattern": self.pattern,
            "callId": self.call_id,
            "createdAt": self.created_at_ms,
        }


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """How a request was settled: the harness outcome, whether to grant the pattern, and why."""

    outcome: ApprovalOutcome
    always: bool = False
    detail: str | None = None


Answerer = Callable[[ApprovalRequest, AbortSignal], Awaitable[ApprovalAnswer]]
"""Asks a person (`dsh run`'s terminal prompt): returns `allow`, `always` or `deny`."""

BrokerListener = Callable[[str, ApprovalRequest, ApprovalDecision | None], None]
"""Called with `("pending", request, None)` and `("settled", request, decision)`."""


class ApprovalBroker:
    """Where approval questions go: an answerer, or pending requests decided through `decide()`.

    One per runtime (`services.approvals`); it lives on the runtime's event loop.
    """

    def __init__(self, *, clock: Callable[[], int] | None = None) -> None:
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._answerer: Answerer | None = None
        self._remote_timeout_s: float | None = None
        self._pending: dict[str, tuple[ApprovalRequest, asyncio.Future[ApprovalAnswer]]] = {}
        self._listeners: list[BrokerListener] = []

    @property
    def answerer(self) -> Answerer | None:
        """The installed answerer, if any."""
        return self._answerer

    def set_answerer(self, answerer: Answerer | None) -> None:
        """Install (or remove, with None) the answerer every question goes to."""
        self._answerer = answerer

    @property
    def remote_timeout_s(self) -> float | None:
        """How long a pending request waits for `decide()`; None when remote decisions are off."""
        return self._remote_timeout_s

    def enable_remote(self, timeout_s: float) -> None:
        """Keep questions pending until `decide()` answers them or `timeout_s` passes (then `unavailable`)."""
        if not timeout_s > 0:
            raise ValueError("the approval timeout must be positive")
        self._remote_timeout_s = timeout_s

    def now_ms(self) -> int:
        """The broker's clock (epoch ms)."""
        return self._clock()

    def pending(self) -> tuple[ApprovalRequest, ...]:
        """The requests waiting for a decision, oldest first."""
        return tuple(request for request, _ in self._pending.values())

    def subscribe(self, listener: BrokerListener) -> Callable[[], None]:
        """Call `listener` when a request becomes pending and when it is settled; returns an unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def decide(self, request_id: str, answer: ApprovalAnswer) -> ApprovalRequest:
        """Answer a pending request.

        Raises:
            ApprovalError: `APPROVAL_NOT_FOUND` when no request with that id is pending.
        """
        entry = self._pending.get(request_id)
        if entry is None or entry[1].done():
            raise ApprovalError(
                f'no approval request "{request_id}" is pending', code="APPROVAL_NOT_FOUND", approval_id=request_id
            )
        entry[1].set_result(answer)
        return entry[0]

    async def request(self, request: ApprovalRequest, signal: AbortSignal) -> ApprovalDecision:
        """Settle one request: `allowed-once`, `rejected`, `cancelled` (the signal aborted) or `unavailable`."""
        if signal.aborted:
            return ApprovalDecision("cancelled")
        if self._answerer is not None:
            waiter: asyncio.Future[ApprovalAnswer] = asyncio.ensure_future(self._answerer(request, signal))
            return await self._settle(request, waiter, signal, timeout_s=None, remote=False)
        if self._remote_timeout_s is not None:
            future: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()
            self._pending[request.id] = (request, future)
            self._emit("pending", request, None)
            try:
                return await self._settle(request, future, signal, timeout_s=self._remote_timeout_s, remote=True)
            finally:
                self._pending.pop(request.id, None)
        return ApprovalDecision("unavailable", detail="no one can approve it here")

    async def _settle(
        self,
        request: ApprovalRequest,
        answer: asyncio.Future[ApprovalAnswer],
        signal: AbortSignal,
        *,
        timeout_s: float | None,
        remote: bool,
    ) -> ApprovalDecision:
        aborted: asyncio.Future[Any] = asyncio.ensure_future(signal.wait())
        waiters: set[asyncio.Future[Any]] = {answer, aborted}
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if signal.aborted:
            decision = ApprovalDecision("cancelled")  # a late answer is dropped: the call is withdrawn
        elif answer in done and not answer.cancelled() and answer.exception() is None:
            decision = _decision_of(answer.result())
        elif answer in done:
            exception = None if answer.cancelled() else answer.exception()
            _log.warning("approval answerer failed (%r); the request fails closed", exception)
            decision = ApprovalDecision("unavailable", detail="the approver failed")
        else:
            decision = ApprovalDecision("unavailable", detail=f"no decision within {timeout_s:g} s")
        if not answer.done():
            answer.cancel()
            with contextlib.suppress(BaseException):
                await answer
        if remote:
            self._emit("settled", request, decision)
        return decision

    def _emit(self, kind: str, request: ApprovalRequest, decision: ApprovalDecision | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, request, decision)
            except Exception:
                _log.exception("approval listener raised")


def _decision_of(answer: object) -> ApprovalDecision:
    if answer == "allow":
        return ApprovalDecision("allowed-once")
    if answer == "always":
        return ApprovalDecision("allowed-once", always=True)
    if answer == "deny":
        return ApprovalDecision("rejected", detail="the user refused it")
    _log.warning("approval answerer returned %r; the request fails closed", answer)
    return ApprovalDecision("unavailable", detail="the approver gave no valid answer")


# The public names (docs/architecture.md#public-names).
Permissions.__module__ = "dsh"
