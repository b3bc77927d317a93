"""Typed configuration: `dsh.Config` (pydantic-settings) and its sections.

Layer: base (an edge: pydantic lives only here and in the HTTP models). Python keyword values are
strict — a `bool`, a float or the string `"4"` for an int field is refused with `ConfigError`
(`CONFIG_INVALID`) — while environment values are strings and are parsed. Environment names use the
prefix `DSH_` and `__` between a section and its field (`DSH_SUBAGENT__COLD_READ_CONCURRENCY=8`);
the settings people type most also have flat names (`DSH_HOME`, `DSH_DATABASE_URL`, `DSH_MODEL`,
`DSH_MODEL_API_KEY` ...), mapped explicitly by a small settings source rather than by pydantic-settings'
JSON guessing: `DSH_MODEL` names the model, it is not a JSON value for the whole `model` section.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dsh.errors import ConfigError

__all__ = [
    "DEFAULT_COLD_READ_CONCURRENCY",
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_BASE_URL",
    "AgentConfig",
    "ApprovalPolicy",
    "ApprovalRuleConfig",
    "ApprovalsConfig",
    "CacheConfig",
    "CompactionConfig",
    "Config",
    "McpConfig",
    "McpServerConfig",
    "ModelConfig",
    "ModelPriceConfig",
    "PersistenceConfig",
    "PostgresConfig",
    "PricesConfig",
    "RuleAction",
    "SandboxConfig",
    "SandboxMode",
    "ServerConfig",
    "SubagentConfig",
    "ToolsConfig",
    "config_file_paths",
    "default_home",
]

DEFAULT_COLD_READ_CONCURRENCY: Final = 4
DEFAULT_MODEL_BASE_URL: Final = "https://api.deepseek.com"
DEFAULT_MODEL: Final = "deepseek-chat"
_MAX_INT32: Final = 2_147_483_647
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class _Section(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigError(_describe(error, type(self).__name__)) from None


class PersistenceConfig(_Section):
    """Persistence settings.

    Attributes:
        write_batch_max_delay_ms: The write-behind window (docs/glossary.md#write-behind-window).
        compression: The encoding of the JSONL logs dsh creates (`DSH_PERSISTENCE__COMPRESSION`):
            `zstd` (`session.jsonl.zstd`, the default) or `none` (`session.jsonl`). Existing logs
            are read and appended to in their own encoding, whatever this says
            (docs/storage-format.md#jsonl-layout).
    """

    write_batch_max_delay_ms: int = Field(default=200, ge=1, le=_MAX_INT32)
    compression: Literal["zstd", "none"] = "zstd"


class PostgresConfig(_Section):
    """PostgreSQL store settings, used with a `postgresql://` database URL (docs/storage-format.md#postgresql-schema).

    Attributes:
        schema_name: The schema holding dsh's tables (`DSH_PG_SCHEMA`, default `dsh`): lower-case
            letters, digits and `_`, starting with a letter or `_`, at most 63 characters.
        lease_ttl_s: How long a session's writer lease lasts without renewal (`DSH_PG_LEASE_TTL_S`).
        lease_renew_s: How often the heartbeat renews every held lease (`DSH_PG_LEASE_RENEW_S`);
            must be shorter than the TTL.
        pool_min_size: Connections the pool keeps open.
        pool_max_size: The most connections the pool opens.
        statement_timeout_ms: The server-side limit of one statement (and of a transaction left
            idle), in milliseconds; 0 turns it off.
        connect_timeout_s: How long opening a connection may take.
    """

    schema_name: str = "dsh"
    lease_ttl_s: float = Field(default=30.0, gt=0, le=86_400)
    lease_renew_s: float = Field(default=10.0, gt=0, le=86_400)
    pool_min_size: int = Field(default=1, ge=1, le=1000)
    pool_max_size: int = Field(default=10, ge=1, le=1000)
    statement_timeout_ms: int = Field(default=30_000, ge=0, le=_MAX_INT32)
    connect_timeout_s: float = Field(default=10.0, gt=0, le=3600)

    @field_validator("schema_name")
    @classmethod
    def _schema_identifier(cls, value: str) -> str:
        if not _SCHEMA_NAME.fullmatch(value):
            raise ValueError(
                f"invalid postgres.schema_name {value!r}: use lower-case letters, digits and _, "
                "starting with a letter or _, at most 63 characters"
            )
        return value

    @model_validator(mode="after")
    def _renewal_before_expiry(self) -> PostgresConfig:
        if self.lease_renew_s >= self.lease_ttl_s:
            raise ValueError(
                f"invalid postgres lease settings: lease_renew_s ({self.lease_renew_s}) must be shorter than "
                f"lease_ttl_s ({self.lease_ttl_s})"
            )
        if self.pool_min_size > self.pool_max_size:
            raise ValueError("invalid postgres pool settings: pool_min_size is larger than pool_max_size")
        return self


class CacheConfig(_Section):
    """Projection-cache write policy (docs/projections.md#cache-write-policy)."""

    write_every_events: int = Field(default=200, ge=1)
    write_interval_ms: int = Field(default=5000, ge=1, le=_MAX_INT32)
    close_timeout_s: float = Field(default=10.0, gt=0)
    idle_ms: int = Field(default=1000, ge=1, le=_MAX_INT32)


class SubagentConfig(_Section):
    """Subagent settings: cold-read concurrency of the catalog and the delegation depth limit."""

    cold_read_concurrency: int = Field(default=DEFAULT_COLD_READ_CONCURRENCY, ge=1, le=64)
    max_depth: int = Field(default=3, ge=0)


class ServerConfig(_Section):
    """`dsh serve` settings (docs/server.md).

    Attributes:
        host: The address to listen on (`DSH_SERVER__HOST`); a non-loopback one needs `--allow-remote`.
        port: The port (`DSH_SERVER__PORT`; 0 picks a free one).
        max_body_bytes: The largest request body accepted (`DSH_SERVE_MAX_BODY_BYTES`, 1 MiB).
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    max_body_bytes: int = Field(default=1 << 20, ge=1, le=_MAX_INT32)


class ModelConfig(_Section):
    """The model endpoint a real (non-scripted) agent talks to (docs/agent.md#model-settings).

    These are the configured values; `dsh.agent.models.resolve_model_settings` applies command-line
    overrides, picks the key that may be sent to the configured host and the provider name.

    Attributes:
        base_url: The OpenAI-compatible endpoint (`DSH_MODEL_BASE_URL`).
        api_key: The key for `base_url`, whatever its host (`DSH_MODEL_API_KEY`).
        deepseek_api_key: A DeepSeek key (`DEEPSEEK_API_KEY`); only ever sent to `api.deepseek.com`.
        model: The model name (`DSH_MODEL`).
        provider: The provider name recorded on assistant messages (`DSH_MODEL_PROVIDER`); None
            derives it from the host.
        timeout_s: The read timeout of one request in seconds (`DSH_MODEL_TIMEOUT_S`).
        max_retries: Retries of a failed request (`DSH_MODEL_MAX_RETRIES`): the client's before the
            first byte, and the agent loop's for a stream that broke after it (docs/agent.md#retries).
        chunk_timeout_s: The longest wait for the next chunk of an open stream
            (`DSH_MODEL_CHUNK_TIMEOUT_S`); past it the stream counts as broken and is retried.
        max_tokens: The default output limit of one request (`DSH_MODEL_MAX_TOKENS`); None leaves it
            to the endpoint.
    """

    base_url: str = DEFAULT_MODEL_BASE_URL
    api_key: SecretStr | None = None
    deepseek_api_key: SecretStr | None = None
    model: str = DEFAULT_MODEL
    provider: str | None = None
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=100)
    chunk_timeout_s: float = Field(default=60.0, gt=0)
    max_tokens: int | None = Field(default=None, ge=1, le=_MAX_INT32)


class AgentConfig(_Section):
    """How agents run their turns (docs/agent.md#turn-events).

    Attributes:
        max_steps: Steps per turn before it ends with `AGENT_MAX_STEPS`.
        log_chunks: Log every streamed chunk as an `assistant/chunk` event (off: chunks reach
            in-process listeners only).
        cancel_grace_s: How long a cancelled tool body may run on before its task is cancelled.
        system_prompt: The system prompt of top-level agents, if any.
        model_titles: Ask the model for a short session title in the background (docs/agent.md#titles).
        structured_output_attempts: Invalid `structured_output` calls and plain answers an agent with
            an output schema may make before its turn ends `STRUCTURED_OUTPUT_MISSING`.
    """

    max_steps: int = Field(default=50, ge=1, le=10_000)
    log_chunks: bool = False
    cancel_grace_s: float = Field(default=5.0, ge=0)
    system_prompt: str | None = None
    instructions: str | None = None
    time_context: bool = True
    time_zone: str | None = None
    model_titles: bool = False
    structured_output_attempts: int = Field(default=3, ge=1, le=100)

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None:
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"invalid agent.time_zone {value!r}: not a known IANA time zone") from None
        return value


DEFAULT_CONTEXT_WINDOWS: Final[dict[str, int]] = {"deepseek-chat": 131_072, "deepseek-reasoner": 131_072}
"""DeepSeek's context length (128K tokens) for its API models."""

_PRUNE_MARKER_CHARS: Final = 39  # len(dsh.agent.compaction.PRUNE_MARKER)


class CompactionConfig(_Section):
    """When agents compact their context (docs/agent.md#compaction).

    Attributes:
        auto: Compact before a request that would fill more than `threshold` of the window.
        threshold: The share of the model's context window a request may fill.
        retain: The share of the window kept verbatim after the summary.
        context_windows: Model name → context window in tokens, added to DeepSeek's defaults.
        summary_max_tokens: The output limit of the summary request.
        prune_threshold_chars: Tool results longer than this are pruned first.
        prune_head_chars: Characters a pruned result keeps from its start.
        prune_tail_chars: Characters it keeps from its end.
    """

    auto: bool = True
    threshold: float = Field(default=0.8, gt=0, le=1)
    retain: float = Field(default=0.16, gt=0, lt=1)
    context_windows: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_CONTEXT_WINDOWS))
    summary_max_tokens: int = Field(default=8192, ge=1, le=_MAX_INT32)
    prune_threshold_chars: int = Field(default=8192, ge=1, le=_MAX_INT32)
    prune_head_chars: int = Field(default=4096, ge=0, le=_MAX_INT32)
    prune_tail_chars: int = Field(default=1024, ge=0, le=_MAX_INT32)

    @field_validator("context_windows")
    @classmethod
    def _windows(cls, value: dict[str, int]) -> dict[str, int]:
        for model, window in value.items():
            if not model or window < 1:
                raise ValueError(f"invalid compaction.context_windows: {model!r} needs a window of at least 1 token")
        return {**DEFAULT_CONTEXT_WINDOWS, **value}

    @model_validator(mode="after")
    def _consistent(self) -> CompactionConfig:
        if self.retain >= self.threshold:
            raise ValueError(f"invalid compaction: retain ({self.retain}) must be below threshold ({self.threshold})")
        kept = self.prune_head_chars + _PRUNE_MARKER_CHARS + self.prune_tail_chars
        if kept > self.prune_threshold_chars:
            raise ValueError(
                f"invalid compaction: prune_head_chars + marker + prune_tail_chars ({kept}) "
                f"must be at most prune_threshold_chars ({self.prune_threshold_chars})"
            )
        return self


class ModelPriceConfig(_Section):
    """One model's prices per million tokens (docs/agent.md#tokens-and-cost)."""

    input: float = Field(ge=0)
    cache_hit_input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write_input: float | None = Field(default=None, ge=0)
    currency: str = Field(default="USD", min_length=1)


DEFAULT_PRICES: Final[dict[str, dict[str, Any]]] = {
    # DeepSeek-V3.2 behind both API models: cache hit $0.028, cache miss $0.28, output $0.42 per 1M tokens.
    "deepseek-chat": {"input": 0.28, "cache_hit_input": 0.028, "output": 0.42},
    "deepseek-reasoner": {"input": 0.28, "cache_hit_input": 0.028, "output": 0.42},
}


class PricesConfig(_Section):
    """The price table: model name → `ModelPriceConfig`, added to DeepSeek's defaults."""

    models: dict[str, ModelPriceConfig] = Field(
        default_factory=lambda: {name: ModelPriceConfig(**price) for name, price in DEFAULT_PRICES.items()}
    )

    @field_validator("models", mode="before")
    @classmethod
    def _with_defaults(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        out: dict[str, object] = {name: ModelPriceConfig(**price) for name, price in DEFAULT_PRICES.items()}
        for name, price in value.items():
            out[name] = ModelPriceConfig(**price) if isinstance(price, dict) else price
        return out


SandboxMode = Literal["read-only", "workspace-write", "danger-full-access"]
"""How far the `bash` tool's sandbox confines a command (docs/tools.md#the-sandbox)."""

ApprovalPolicy = Literal["ask", "never"]
"""What an `ask` rule does: ask someone, or reject without asking (docs/tools.md#approvals)."""

RuleAction = Literal["allow", "ask", "deny"]
"""What an approval rule does with a matching tool call."""


def _sandbox_alias(value: object) -> object:
    # `off` is the spelling people reach for; the harness's vocabulary calls it danger-full-access.
    return "danger-full-access" if value == "off" else value


_SandboxModeSetting = Annotated[SandboxMode, BeforeValidator(_sandbox_alias)]


class ApprovalRuleConfig(_Section):
    """One approval rule: a tool name (`*` for any), a pattern over the call's subject, and an action.

    The subject is what the rule is about: the command of a `bash` call, the path of a file tool, the
    pattern of a search, the compact JSON arguments of any other tool. Patterns use shell wildcards
    (`*`, `?`, `[...]`) and must match the whole subject (docs/tools.md#approval-rules).
    """

    tool: str = Field(min_length=1)
    pattern: str = "*"
    action: RuleAction


class ApprovalsConfig(_Section):
    """Approvals of tool calls (docs/tools.md#approvals).

    Attributes:
        policy: `ask` asks someone when a rule says `ask`; `never` rejects those calls without asking.
        allow_all: Run every call without asking (deny rules still apply).
        rules: Rules checked before the defaults, first match wins.
        timeout_s: How long a request pending on the HTTP API waits before it is denied.
    """

    policy: ApprovalPolicy = "ask"
    allow_all: bool = False
    rules: tuple[ApprovalRuleConfig, ...] = ()
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)

    @field_validator("rules", mode="before")
    @classmethod
    def _rule_list(cls, value: object) -> object:
        # A list of rules (or of rule tables) is as good as a tuple; the stored value is a tuple.
        return tuple(value) if isinstance(value, list) else value


class SandboxConfig(_Section):
    """The `bash` tool's sandbox (docs/tools.md#the-sandbox).

    Attributes:
        mode: `read-only`, `workspace-write` or `danger-full-access` (`off` is accepted for the last).
        network: Allow network connections inside the sandbox.
        when_unavailable: Where bubblewrap cannot run: `refuse` the tool, or `warn` once and run unsandboxed.
    """

    mode: _SandboxModeSetting = "workspace-write"
    network: bool = False
    when_unavailable: Literal["refuse", "warn"] = "refuse"


class ToolsConfig(_Section):
    """Limits of the workspace tools (docs/tools.md#workspace-tools)."""

    bash_timeout_ms: int = Field(default=120_000, ge=1, le=_MAX_INT32)
    bash_max_timeout_ms: int = Field(default=600_000, ge=1, le=_MAX_INT32)
    bash_max_output_bytes: int = Field(default=64_000, ge=256, le=_MAX_INT32)
    read_max_lines: int = Field(default=2000, ge=1, le=1_000_000)
    read_max_bytes: int = Field(default=50 * 1024, ge=256, le=_MAX_INT32)
    glob_max_results: int = Field(default=100, ge=1, le=100_000)
    grep_max_matches: int = Field(default=250, ge=1, le=100_000)


_MCP_SERVER_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")


class McpServerConfig(_Section):
    """One MCP server whose tools the agents get (docs/tools.md#mcp-servers).

    Exactly one of `command` (a stdio server this process starts) and `url` (a streamable HTTP
    server) is set. Values of `env` and `headers` may name environment variables as `${NAME}`; they
    are read when the server is started, so a secret stays out of the file.

    Attributes:
        command: The executable of a stdio server.
        args: Its arguments.
        env: Variables set for it, on top of a minimal inherited environment (PATH, HOME ...).
        cwd: Its working folder.
        url: The endpoint of a streamable HTTP server.
        headers: Request headers of an HTTP server (`Authorization = "Bearer ${MCP_TOKEN}"`).
        approval: How a call of any of its tools is approved: `ask` (the default), `allow` or `deny`.
        tool_approvals: The same per tool, by the server's own tool name; beats `approval`.
        startup_timeout_s: How long starting the server and listing its tools may take.
        call_timeout_s: How long one tool call may take before the server counts as hung.
        enabled: False keeps the entry without starting the server.
    """

    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    approval: RuleAction = "ask"
    tool_approvals: dict[str, RuleAction] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    call_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    enabled: bool = True

    @field_validator("args", mode="before")
    @classmethod
    def _arg_list(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of command (stdio) and url (streamable HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"an MCP server url must be http(s), got {self.url!r}")
        return self

    @property
    def transport(self) -> Literal["stdio", "streamable-http"]:
        """`stdio` or `streamable-http`."""
        return "stdio" if self.command is not None else "streamable-http"


class McpConfig(_Section):
    """MCP servers by name (`[mcp.servers.<name>]`, docs/tools.md#mcp-servers).

    A name is 1 to 32 letters, digits, `_` or `-`; the server's tools are offered as
    `mcp__<name>__<tool>`.
    """

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in value:
            if not _MCP_SERVER_NAME.fullmatch(name):
                raise ValueError(f"invalid MCP server name {name!r}: use 1-32 letters, digits, _ or -")
        return value


def default_home() -> Path:
    """`~/.local/share/dsh`."""
    return Path.home() / ".local" / "share" / "dsh"


def config_file_paths(workspace: Path | None) -> tuple[Path, Path | None]:
    """The user's configuration file and the workspace's (docs/cli.md#configuration-files).

    `$XDG_CONFIG_HOME/dsh/config.toml` (else `~/.config/dsh/config.toml`) and
    `<workspace>/.dsh/config.toml`; neither need exist. `dsh.config_files` reads them; `Config()`
    never does.
    """
    base = os.environ.get("XDG_CONFIG_HOME")
    user = (Path(base) if base else Path.home() / ".config") / "dsh" / "config.toml"
    return user, (workspace / ".dsh" / "config.toml" if workspace is not None else None)


_SECTIONS: Final[dict[str, type[_Section]]] = {
    "persistence": PersistenceConfig,
    "postgres": PostgresConfig,
    "cache": CacheConfig,
    "subagent": SubagentConfig,
    "server": ServerConfig,
    "model": ModelConfig,
    "agent": AgentConfig,
    "approvals": ApprovalsConfig,
    "sandbox": SandboxConfig,
    "tools": ToolsConfig,
    "compaction": CompactionConfig,
    "prices": PricesConfig,
    "mcp": McpConfig,
}

_FLAT: Final[dict[str, str]] = {"DSH_HOME": "home", "DSH_DATABASE_URL": "database_url"}

_FLAT_SECTION_FIELDS: Final[dict[str, tuple[str, str]]] = {
    "DSH_MODEL": ("model", "model"),
    "DSH_MODEL_BASE_URL": ("model", "base_url"),
    "DSH_MODEL_API_KEY": ("model", "api_key"),
    "DSH_MODEL_PROVIDER": ("model", "provider"),
    "DSH_MODEL_TIMEOUT_S": ("model", "timeout_s"),
    "DSH_MODEL_MAX_RETRIES": ("model", "max_retries"),
    "DSH_MODEL_CHUNK_TIMEOUT_S": ("model", "chunk_timeout_s"),
    "DSH_MODEL_MAX_TOKENS": ("model", "max_tokens"),
    "DEEPSEEK_API_KEY": ("model", "deepseek_api_key"),
    "DSH_SERVE_MAX_BODY_BYTES": ("server", "max_body_bytes"),
    "DSH_PG_SCHEMA": ("postgres", "schema_name"),
    "DSH_PG_LEASE_TTL_S": ("postgres", "lease_ttl_s"),
    "DSH_PG_LEASE_RENEW_S": ("postgres", "lease_renew_s"),
    "DSH_SANDBOX": ("sandbox", "mode"),
}
"""Flat names of section fields. An empty flat variable counts as unset; when both a flat name and
the nested `DSH_<SECTION>__<FIELD>` are set, the nested one wins (it is the canonical spelling)."""


def _describe(error: ValidationError, owner: str) -> str:
    parts = []
    for item in error.errors():
        inner = item.get("ctx", {}).get("error")
        if isinstance(inner, ConfigError):
            parts.append(inner.message)
            continue
        where = ".".join(str(p) for p in item["loc"])
        text = f"{item['msg']} (got {item.get('input')!r})"
        parts.append(f"{where}: {text}" if where else text)
    return "; ".join(parts) if all(p.startswith("invalid ") for p in parts) else f"invalid {owner}: " + "; ".join(parts)


class _EnvironmentSource(PydanticBaseSettingsSource):
    """Reads `DSH_*` variables: flat aliases plus `DSH_<SECTION>__<FIELD>`; parses strings."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = os.environ
        out: dict[str, Any] = {}
        for name, field in _FLAT.items():
            value = env.get(name)
            if value:
                out[field] = value
        for section, model in _SECTIONS.items():
            parsed: dict[str, Any] = {}
            for name, (flat_section, field) in _FLAT_SECTION_FIELDS.items():
                value = env.get(name)
                if flat_section == section and value:
                    parsed[field] = _parse_env(name, value, model.model_fields[field])
            for field, info in model.model_fields.items():
                name = f"DSH_{section.upper()}__{field.upper()}"
                value = env.get(name)
                if value is not None:
                    parsed[field] = _parse_env(name, value, info)
            if parsed:
                out[section] = model(**parsed)
        return out


def _parse_env(name: str, value: str, info: FieldInfo) -> Any:
    # The field's constraints (ge/le ...) travel with its type, so a value that parses but is out of
    # range is refused here, naming the variable the person typed.
    target: Any = info.annotation or str
    if info.metadata:
        target = Annotated[(target, *info.metadata)]
    try:
        if value.lstrip().startswith(("[", "{")):
            return TypeAdapter(target).validate_json(value)  # a list or table setting, written as JSON
        return TypeAdapter(target).validate_strings(value)
    except ValidationError as error:
        raise ConfigError(_describe(error, f"environment variable {name}")) from None


class Config(BaseSettings):
    """The whole typed configuration of a runtime.

    Args:
        home: The home folder (`$DSH_HOME`, default `~/.local/share/dsh`).
        database_url: `sqlite:///<path>` or `postgresql://...`; None selects JSONL under `home`.
    """

    model_config = SettingsConfigDict(strict=True, extra="forbid", frozen=True)

    home: Path = Field(default_factory=default_home)
    database_url: str | None = None
    persistence: PersistenceConfig = Field(default_factory=PersistenceConfig)
    postgres: PostgresConfig = Field(default_factory=PostgresConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    subagent: SubagentConfig = Field(default_factory=SubagentConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    prices: PricesConfig = Field(default_factory=PricesConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigError(_describe(error, "Config")) from None

    @field_validator("home", mode="before")
    @classmethod
    def _home_path(cls, value: object) -> object:
        if isinstance(value, str):
            if not value:
                raise ValueError("home must not be empty")
            return Path(value).expanduser()
        return value

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_shorthand(cls, value: object) -> object:
        # `sandbox = "off"` (or any mode) is short for `[sandbox] mode = ...`.
        return {"mode": value} if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvironmentSource(settings_cls))

    @property
    def sessions_dir(self) -> Path:
        """Where the JSONL backend keeps logs."""
        return self.home / "sessions"

    @property
    def cache_path(self) -> Path:
        """The SQLite projection cache file."""
        return self.home / "cache.sqlite3"


# Shown under the name users import (docs/architecture.md#public-names).
Config.__module__ = "dsh"
