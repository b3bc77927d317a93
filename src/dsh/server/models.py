"""Wire models of the HTTP API: request bodies (validated) and response shapes (documented).

Layer: server. Requests are pydantic v2 models with camelCase aliases and `extra='forbid'`: an
unknown field, a wrong type or a value out of range is a `bad-request` before any handler runs.
Responses are built from the library's own `to_json()` forms and sent as they are (absent optionals
left out, projection values verbatim so a `null` stays a present `null`); the `TypedDict`s below only
describe them in `/openapi.json`. The limits are the ones docs/server.md#request-validation lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, NotRequired

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from typing_extensions import TypedDict  # pydantic needs this TypedDict before Python 3.12

from dsh.session.header import SessionHeader as _Header

__all__ = [
    "MAX_BLOCKS",
    "MAX_PAGE",
    "MAX_TEXT_CHARS",
    "Accepted",
    "ApprovalDecided",
    "ApprovalDecisionBody",
    "ApprovalList",
    "ApprovalSummary",
    "CatalogEntry",
    "CompactionOutcome",
    "CompactionSummary",
    "CreateSessionBody",
    "EmptyBody",
    "ErrorBody",
    "Health",
    "HistoryPage",
    "MessageAccepted",
    "PromptBody",
    "SessionCreated",
    "SessionHeader",
    "SessionList",
    "SessionSummary",
    "SubagentCatalog",
    "TextBlock",
    "TokenSummary",
    "summary_json",
]

MAX_TEXT_CHARS: Final = 100_000
"""The longest text block (and `createSession` prompt) in characters."""
MAX_BLOCKS: Final = 32
"""The most content blocks one prompt may carry."""
MAX_PAGE: Final = 200
"""The largest `limit` and `maxMessages`."""
MAX_TIME_ZONE_CHARS: Final = 64


def _no_lone_surrogate(value: str) -> str:
    # JSON may spell a lone surrogate (`"\ud800"`); such text is not Unicode and no log may hold it.
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise ValueError("text must not contain a lone surrogate")
    return value


_Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS), AfterValidator(_no_lone_surrogate)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False, frozen=True)


class TextBlock(_Request):
    """One text content block."""

    type: Literal["text"]
    text: _Text


class PromptBody(_Request):
    """The body of `promptSession` and `promptSubagent`."""

    content: list[TextBlock] = Field(min_length=1, max_length=MAX_BLOCKS)
    client_time_zone: Annotated[
        str | None,
        Field(alias="clientTimeZone", min_length=1, max_length=MAX_TIME_ZONE_CHARS),
        AfterValidator(lambda value: value if value is None else _no_lone_surrogate(value)),
    ] = None

    def blocks(self) -> list[dict[str, Any]]:
        """The content as plain text blocks."""
        return [{"type": "text", "text": block.text} for block in self.content]


class CreateSessionBody(_Request):
    """The (optional) body of `createSession`."""

    prompt: Annotated[
        str | None,
        Field(min_length=1, max_length=MAX_TEXT_CHARS),
        AfterValidator(lambda value: value if value is None else _no_lone_surrogate(value)),
    ] = None


class ApprovalDecisionBody(_Request):
    """The body of `decideApproval`: allow this call, allow calls like it for the session, or refuse it."""

    decision: Literal["allow", "always", "deny"]


class EmptyBody(_Request):
    """The body of a route that takes none (the interrupts, `resumeSession`): nothing, `null` or `{}`."""


# ---------------------------------------------------------------- responses (documentation only)


class Health(TypedDict):
    """`GET /api/v1/health`."""

    ok: Literal[True]
    version: str


class TokenSummary(TypedDict):
    """A session's token total (docs/agent.md#tokens-and-cost); `cost` and `currency` only for priced models."""

    inputTokens: int
    outputTokens: int
    cacheReadTokens: int
    cacheWriteTokens: int
    reasoningTokens: int
    requests: int
    cost: NotRequired[float]
    currency: NotRequired[str]


class SessionSummary(TypedDict):
    """One session as lists show it: header facts, the agent registry's status and, when known without a log
    read, its title and token total."""

    id: str
    createdAt: int
    parentSession: NotRequired[str]
    origin: NotRequired[Literal["subagent"]]
    isSeeded: bool
    delegationDepth: int
    status: Literal["running", "idle", "stored"]
    title: NotRequired[str]
    tokens: NotRequired[TokenSummary]


class CompactionSummary(TypedDict):
    """One compaction (docs/agent.md#compaction)."""

    compactionId: str
    startSeq: int
    summarySeq: int
    endSeq: int
    summary: str
    shadowedSeqs: list[int]
    shadowedTokenCount: int
    pruned: int


class CompactionOutcome(TypedDict):
    """`POST /api/v1/sessions/{id}/compact`: whether a compaction was written, and which."""

    compacted: bool
    compaction: NotRequired[CompactionSummary]


class ApprovalSummary(TypedDict):
    """A tool call waiting for a decision (the `approval` of an `approval/pending` frame)."""

    id: str
    sessionId: str
    label: str
    toolName: str
    subject: str
    preview: str
    pattern: str
    callId: str
    createdAt: int


class ApprovalList(TypedDict):
    """`listApprovals`: the pending requests, oldest first."""

    items: list[ApprovalSummary]


class ApprovalDecided(TypedDict):
    """`decideApproval`: the request that was answered, and the answer."""

    id: str
    sessionId: str
    decision: Literal["allow", "always", "deny"]


class SessionList(TypedDict):
    """A page of `listSessions`; `nextCursor` is null on the last page."""

    items: list[SessionSummary]
    nextCursor: str | None


class SessionCreated(TypedDict):
    """`createSession`: the new session, and the prompt's message id when one was sent."""

    session: SessionSummary
    messageId: NotRequired[str]


class MessageAccepted(TypedDict):
    """A prompt accepted into an inbox."""

    messageId: str


class Accepted(TypedDict):
    """An interrupt request accepted (also when there was nothing to interrupt)."""

    accepted: Literal[True]


class SessionHeader(TypedDict):
    """The session header as `SessionHeader.to_json()` writes it."""

    version: int
    id: str
    createdAt: int
    cwd: NotRequired[str]
    parentSession: NotRequired[str]
    isSeeded: bool
    delegationDepth: int
    origin: NotRequired[Literal["subagent"]]
    agentPreset: NotRequired[str]


class HistoryEntry(TypedDict):
    """One event of a page, with an optional presentation hint."""

    event: dict[str, Any]
    view: NotRequired[Any]


class ProjectionBlock(TypedDict):
    """The projection snapshot of the observed log (tail pages only); values are verbatim, `null` included."""

    asOfSeq: int
    values: dict[str, Any]


class HistoryPage(TypedDict):
    """One message-aligned history page (docs/query.md#history-pages)."""

    sessionId: str
    header: SessionHeader
    inheritedEventCount: int
    live: bool
    events: list[HistoryEntry]
    hasMore: bool
    nextBeforeSeq: NotRequired[int]
    projections: NotRequired[ProjectionBlock]


class ChildEntry(TypedDict):
    """A catalog child row; `parentId` and `depth` only with `scope=descendants`."""

    kind: Literal["child"]
    id: str
    mode: Literal["one-shot", "continuable"]
    label: NotRequired[str]
    activity: Literal["running", "inactive"]
    hasChildren: bool
    parentId: NotRequired[str]
    depth: NotRequired[int]


class DiagnosticEntry(TypedDict):
    """A child that exists but whose identity cannot be shown."""

    kind: Literal["diagnostic"]
    id: str
    reason: Literal["corrupt", "unsupported", "unavailable"]
    parentId: NotRequired[str]
    depth: NotRequired[int]


CatalogEntry = ChildEntry | DiagnosticEntry


class SubagentCatalog(TypedDict):
    """`listSubagents`: the listing's rows, in its order, whether the parent's agent is live, and
    `unlisted`: how many stored sessions of the whole store the listing could not read at all."""

    entries: list[CatalogEntry]
    parentAvailable: bool
    unlisted: int


class ErrorDetail(TypedDict):
    """`code` is a wire code; `details` depends on it (docs/server.md#errors)."""

    code: str
    message: str
    details: dict[str, Any]


class ErrorBody(TypedDict):
    """Every error response."""

    error: ErrorDetail


def summary_json(
    header: _Header, status: str, title: str | None = None, tokens: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The wire `SessionSummary` of a header (absent optionals left out)."""
    out: dict[str, Any] = {"id": header.id, "createdAt": header.created_at}
    if header.parent_session is not None:
        out["parentSession"] = header.parent_session
    if header.origin is not None:
        out["origin"] = header.origin
    out["isSeeded"] = header.is_seeded
    out["delegationDepth"] = header.delegation_depth
    out["status"] = status
    if title is not None:
        out["title"] = title
    if tokens is not None:
        out["tokens"] = dict(tokens)
    return out
