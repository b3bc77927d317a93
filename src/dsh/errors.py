"""The root error, the error families, and the complete table of error codes.

Layer: base (imported by every layer, imports nothing of dsh). Every exception dsh raises on purpose
derives from `DshError` and carries a stable `code`. Concrete classes live in their layer's
module; this module holds the root, the cross-layer families, and the one table that lists every
code. A code names exactly one failure kind; a class may carry several codes. A test checks that the
table below lists every code some class can carry, and lists each code once.

Classes and codes (docs/errors.md#families): one class per family, with its codes as data (the
`codes` class attribute); callers route on `.code`. A family gets a subclass only where callers must
catch one failure kind apart from the rest with `except`: the persistence verdicts (nothing stored,
a format this build cannot read, corruption, a writer conflict ...) are such classes, and so are
`SessionForkError` (fork refusals), `SubagentDescriptorError` and `SubagentDepthError`.

Constructor convention (docs/errors.md#error-shape): `message` comes first; `code` is a keyword
(`SubagentError(message, code, cause=None)` keeps it as the second positional argument, as its
public signature has it); typed context attributes (`session_id`, `path`, `reason` ...) are
keywords. A class whose text follows from its context may default the message (`AbortError`,
`SubagentDepthError`).

Class tree (module in parentheses):

    DshError                                   root; every instance has `.code`
    ├── ConfigError (ValueError)               dsh.errors
    ├── NotJsonError (ValueError)              dsh.json
    ├── AbortError                             dsh.abort
    ├── SessionError                           dsh.session.errors
    │   └── SessionForkError                   dsh.session.errors
    ├── SessionPersistenceError (family)       dsh.persistence.errors
    │   ├── SessionNotFoundError
    │   ├── SessionFormatUnsupportedError
    │   ├── SessionCorruptionError
    │   ├── SessionAlreadyExistsError
    │   ├── SessionLiveError
    │   ├── AppendConflictError
    │   ├── LeaseHeldError
    │   ├── LeaseLostError
    │   ├── StoreFormatUnsupportedError
    │   ├── StoreMisconfiguredError
    │   ├── PersistenceIOError
    │   ├── PersistenceClosedError
    │   └── OperationCancelledError
    ├── ProjectionError                        dsh.projection.errors
    ├── SessionQueryError                      dsh.query.errors
    ├── SubagentError                          dsh.subagent.errors
    ├── SubagentDescriptorError (ValueError)   dsh.subagent.errors
    ├── SubagentDepthError                     dsh.subagent.errors
    ├── AgentError                             dsh.agent.errors
    ├── ToolError                              dsh.agent.errors
    ├── ApprovalError                          dsh.agent.errors
    └── ModelError                             dsh.agent.errors

Codes (each listed once; the meaning is the one failure kind the code names):

    CONFIG_INVALID                           a constructor argument or configuration value is invalid
    NOT_JSON                                 a value is not lossless JSON (type, range, depth, cycle, key)
    ABORTED                                  an operation observed an aborted AbortSignal
    INVALID_HEADER                           a session header failed validation
    INVALID_SEED                             a constructor seed or inherited cut failed validation
    INVALID_EVENT                            an event failed validation at append
    APPEND_REENTRANT                         an append re-entered a session that is publishing an append
    SESSION_ALREADY_EXISTS                   the session id is already live or already stored
    SESSION_NOT_LIVE                         the session is not the live instance in this store
    SESSION_RETIRED                          the session was disposed or vetoed and accepts no appends
    SESSION_STORE_CLOSED                     the session store was closed and refuses new work
    SESSION_NOT_FOUND                        no session with that id exists (live or stored)
    INVALID_BOUNDARY                         a fork boundary is not a valid event seq of the source
    OPEN_TURN                                a fork boundary falls inside an open turn
    SESSION_FORMAT_UNSUPPORTED               an intact stored log uses a format this build cannot read
    SESSION_CORRUPT                          a stored log was read but failed validation
    SESSION_LIVE                             a stored session cannot be prepared while it is live here
    APPEND_SEQ_MISMATCH                      a batch does not start at the stored next seq
    SESSION_LEASE_HELD                       another process or host is the session's writer
    SESSION_LEASE_LOST                       this host was fenced out of a session it was writing
    STORE_FORMAT_UNSUPPORTED                 the store's schema or application id is foreign or unknown
    STORE_MISCONFIGURED                      the store location is unusable as configured
    PERSISTENCE_IO                           an OS or database driver operation failed
    PERSISTENCE_CLOSED                       the persistence coordinator was closed
    OPERATION_CANCELLED                      a persistence read observed the caller's aborted signal
    PROJECTION_INVALID_UNIT                  a projection unit definition is malformed
    PROJECTION_VERSION_CONFLICT              a projection key is registered with another version or visibility
    PROJECTION_UNIT_FAILED                   a selected projection unit raised and is disabled for the session
    PROJECTION_INVALID_VIEW                  a rendered client view failed its schema or is not plain JSON
    PROJECTION_INVALID_STATE                 a checkpointed state failed the unit's state schema
    PROJECTION_REREAD_REQUIRED               a checkpoint cannot seed a fold from the given tail
    PROJECTION_CACHE_UNAVAILABLE             the projection cache storage refused to open
    PROJECTION_CACHE_STORAGE_FAILED          a projection cache read or write failed
    PROJECTION_CACHE_NOT_JSON                a checkpoint is not losslessly JSON-serializable
    SESSION_QUERY_ABORTED                    a query observed the caller's aborted signal
    SESSION_QUERY_SESSION_NOT_FOUND          the queried id is neither live nor persisted
    SESSION_QUERY_CORRUPT_SESSION            the observed stored log is corrupt or its cut is inconsistent
    SESSION_QUERY_UNSUPPORTED_FORMAT         the observed stored log uses a format this build cannot read
    SESSION_QUERY_PERSISTENCE_FAILED         a persistence listing or inspection failed for another reason
    SESSION_QUERY_SOURCE_CONFLICT            sources disagree about one id's lifecycle
    SESSION_QUERY_INVALID_WINDOW             a history page's before_seq is not a non-negative integer
    SESSION_QUERY_INVALID_LIMIT              a history page's max_messages is out of range
    SESSION_QUERY_INVALID_LINEAGE            parentSession links form a cycle
    SESSION_QUERY_INVALID_FILTER             a session filter is malformed
    SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE   listing subagents without a projection registry
    SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE listing subagents without a session store
    SUBAGENT_CONTROL_QUERY_UNAVAILABLE         listing subagents without a session query service
    SUBAGENT_CONTROL_UNITS_UNAVAILABLE         listing subagents without the subagent projection unit
    CANCELLED                                  a subagent listing observed caller cancellation
    DUPLICATE_PROVIDER                         a subagent provider name is already registered
    NO_PROVIDER                                a subagent provider name is not registered
    UNSUPPORTED_CAPABILITY                     a subagent provider lacks a requested capability
    CONTINUATION_UNAVAILABLE                   continuable subagents need the live agent registry
    PERSISTENCE_UNAVAILABLE                    continuable subagents need session persistence
    DUPLICATE_CHILD                            a continuable child id is already live or stored
    DRAINING                                   subagent admission is closed while the runtime drains
    ACTIVATION_CLOSING                         the target activation is being disposed
    UNAUTHORIZED                               delivery or interrupt authority failed
    NOT_RESUMABLE                              a subagent has no supported continuation state
    ACTIVATION_TEARDOWN_FAILED                 disposing a subagent activation failed
    SUBAGENT_DESCRIPTOR_INVALID                a persisted subagent descriptor payload is malformed
    SUBAGENT_DEPTH_EXCEEDED                    a child would exceed the maximum delegation depth
    DUPLICATE_AGENT                            an agent id is already registered
    AGENT_CLOSING                              a message was sent to an agent that is closing
    AGENT_MAX_STEPS                            a turn reached the step cap without a final answer
    AGENT_TURN_FAILED                          a turn failed on an unexpected error (a bug)
    COMPACTION_FAILED                          a compaction's summary request failed; the session is unchanged
    PERSISTENCE_FLUSH_FAILED                   a turn stopped because its session could not be flushed
    SESSION_OWNED_BY_SUBAGENT                  a generic agent route refused a subagent-origin session
    STRUCTURED_OUTPUT_MISSING                  a turn with an output schema spent its attempts without a valid result
    DUPLICATE_TOOL                             a tool name is already registered
    TOOL_INVALID                               a function cannot be made a tool (hints, parameters, name)
    PATH_OUTSIDE_WORKSPACE                     a workspace tool's path resolves outside the workspace root
    FILE_NOT_FOUND                             a file a workspace tool needs does not exist
    FILE_NOT_REGULAR                           a workspace tool's path is a folder or another non-file
    FILE_NOT_TEXT                              a file is binary or not valid UTF-8
    READ_OUT_OF_RANGE                          a read's offset lies past the end of the file
    EDIT_NOT_FOUND                             an edit's old text does not occur in the file
    EDIT_AMBIGUOUS                             an edit's old text occurs more than once and replace_all is off
    SEARCH_FAILED                              a glob or grep search could not run (bad pattern, ripgrep failure)
    SANDBOX_DENIED                             the sandbox mode forbids the change (read-only mode)
    SANDBOX_UNAVAILABLE                        bubblewrap cannot run and the sandbox settings refuse to run unconfined
    STRUCTURED_OUTPUT_INVALID                  structured_output arguments do not match the output schema
    MCP_SERVER_UNAVAILABLE                     an MCP server failed to start, died or timed out
    MCP_CALL_FAILED                            an MCP server answered a tool call with an error
    APPROVAL_RULE_DENIED                       a deny rule matched a tool call, which did not run
    APPROVAL_REJECTED                          the approval of a tool call was refused (by a person or the never policy)
    APPROVAL_UNAVAILABLE                       a tool call needed approval and no one could give it
    APPROVAL_NOT_FOUND                         an approval decision named a request that is not pending
    MODEL_NOT_CONFIGURED                       no usable model key or base URL is configured
    MODEL_AUTH                                 the model endpoint refused the credentials
    MODEL_RATE_LIMITED                         the model endpoint kept rate-limiting after retries
    MODEL_BAD_REQUEST                          the model endpoint rejected the request
    MODEL_UNAVAILABLE                          the model endpoint failed, or its stream broke or was malformed
    MODEL_TIMEOUT                              a model request timed out
    SCRIPT_INVALID                             a model script failed to load or validate
    SCRIPT_MISMATCH                            a request did not match the next scripted step
    SCRIPT_EXHAUSTED                           a scripted track had no step left for a request
    SCRIPT_UNKNOWN_AGENT                       a request named an agent key the script has no track for
    SCRIPT_PLACEHOLDER                         a script placeholder could not be resolved
    SCRIPT_UNCONSUMED                          scripted steps remained when the script was checked
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ConfigError", "DshError"]


class DshError(Exception):
    """Root of every error dsh raises on purpose.

    Args:
        message: Human-readable text. Texts callers match on are stable data; others may change.
        code: One of the class's `codes`; defaults to the class's only code.

    Attributes:
        code: The stable SCREAMING_SNAKE code naming the failure kind.
    """

    codes: ClassVar[frozenset[str]] = frozenset()
    code: str

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        cls = type(self)
        if code is None:
            if len(cls.codes) != 1:
                raise TypeError(f"{cls.__name__} carries several codes; pass code=")
            (code,) = cls.codes
        elif code not in cls.codes:
            raise TypeError(f"{cls.__name__} cannot carry code {code!r}")
        self.code = code

    @property
    def message(self) -> str:
        """The message the error was raised with."""
        return str(self.args[0]) if self.args else ""


class ConfigError(DshError, ValueError):
    """An invalid constructor argument or configuration value (`CONFIG_INVALID`, CLI exit 4)."""

    codes = frozenset({"CONFIG_INVALID"})


# Shown under the name users import (docs/architecture.md#public-names).
ConfigError.__module__ = "dsh"
DshError.__module__ = "dsh"
