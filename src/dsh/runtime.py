"""`Runtime`: the composition root that wires the default services from a typed `Config`.

Layer: top (above every service layer; the CLI and the server use it). `async with
Runtime.open(config) as rt:` builds, in order, the session store, persistence (JSONL+zstd under the
home folder by default, SQLite for `sqlite:///...`, PostgreSQL for `postgresql://...`, in-memory for
`memory:`), the projection registry, the projection cache (a SQLite file, or a table beside the
sessions in PostgreSQL; if it refuses to open, the runtime logs one warning and runs without it), the
query service, the live agent registry and the subagent runtime (with this runtime as its agent
host). It closes in the one order every hand-built stack must follow too: open
turns cancelled → subagents drained child-first → remaining agents → sessions (dispose, which
triggers the cache's mandatory writes) → cache → unit registrations → registry → persistence.

`Runtime.open(config, read_only=True)` is the open every read-only command uses
(docs/storage-format.md#read-only-opens): it creates no folder, file or table, opens SQLite files
with `mode=ro`, runs without the projection cache when `cache.sqlite3` is absent, refuses a missing
store with one clear error (`STORE_MISCONFIGURED`), and starts no agents.

Agents (docs/agent.md): `create_agent`, `resume_agent`, `run` and `settle` drive live agents on the
runtime's model client — the one passed to `open(model=...)`, or an OpenAI-compatible client built
from `config.model` on first use (so a runtime without a key works until a model is needed). Their
tools are the four subagent tools (unless `subagent_tools=False`), the workspace tools when a
`workspace` is given, and the caller's tools (plain functions are made tools with `dsh.tool`); an
agent may get more of its own. Every agent runs with the runtime's `Permissions` (from
`config.approvals` and `config.sandbox` unless given) and asks through `services.approvals`
(docs/tools.md#approvals); its system prompt is composed by `dsh.agent.instructions`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import unquote, urlparse

from dsh.agent.errors import AgentError
from dsh.agent.ids import IdFactory, RandomIds
from dsh.agent.registry import AgentRegistry
from dsh.errors import ConfigError
from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import PersistenceIOError, StoreMisconfiguredError
from dsh.projection.cache import ProjectionCache, ProjectionCacheConfig
from dsh.projection.cache_storage import CacheStorage, SqliteCacheStorage
from dsh.projection.errors import ProjectionError
from dsh.projection.registry import ProjectionRegistry
from dsh.query.service import SessionQuery
from dsh.services import Services
from dsh.session.header import HeaderInit, SessionHeader
from dsh.session.session import Session
from dsh.session.store import SessionStore, wall_clock_ms
from dsh.subagent.runtime import SubagentRuntime
from dsh.timer import Timer

if TYPE_CHECKING:
    # The agent loop, the tools (pydantic models) and the config (pydantic-settings) load when a
    # runtime is built or an agent starts, not when this module is imported
    # (docs/architecture.md#import-cost).
    from dsh.abort import AbortSignal
    from dsh.agent.accounting import ListedFacts
    from dsh.agent.approval import ApprovalBroker, Permissions
    from dsh.agent.compaction import CompactionResult, CompactionSettings
    from dsh.agent.loop import Agent, AgentOptions, TurnResult
    from dsh.agent.messages import Source
    from dsh.agent.model import ModelClient
    from dsh.agent.tools import Tool, ToolRegistry
    from dsh.agent.usage import ModelPrice, TokenTotals
    from dsh.config import Config
    from dsh.tools.mcp import McpHub

    ToolLike = Tool | Callable[..., object]
    """A tool, or a type-hinted function `dsh.tool` makes one of."""

__all__ = ["Runtime", "backend_for"]


def _as_tool(item: object) -> Tool:
    """A tool as it is; a plain function made a tool with `dsh.tool`."""
    from dsh.agent.tools import Tool

    if isinstance(item, Tool):
        return item
    if callable(item):
        from dsh.agent.function_tool import tool

        return tool(item)
    raise ConfigError(f"not a tool or a function: {item!r}")


def _owned_by_subagent(session_id: str) -> AgentError:
    return AgentError(
        f'session "{session_id}" is owned by subagent routing', code="SESSION_OWNED_BY_SUBAGENT", session_id=session_id
    )


_log = logging.getLogger(__name__)


def backend_for(config: Config, *, read_only: bool = False) -> StorageBackend:
    """The storage backend `config` selects (JSONL+zstd under `home/sessions` by default).

    With `read_only`, the file backends create and change nothing (docs/storage-format.md#read-only-opens).
    """
    url = config.database_url
    if url is None:
        from dsh.persistence.jsonl import JsonlBackend

        return JsonlBackend(config.sessions_dir, compression=config.persistence.compression, read_only=read_only)
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        from dsh.persistence.sqlite import SqliteBackend

        # SQLAlchemy's convention: `sqlite:///relative.db`, `sqlite:////absolute/path.db`;
        # `sqlite://` alone selects the default file in the home folder.
        raw = unquote(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else ""
        path = Path(raw).expanduser().resolve() if raw else config.home / "sessions.sqlite3"
        return SqliteBackend(path, read_only=read_only)
    if parsed.scheme == "memory":
        from dsh.persistence.memory import MemoryBackend

        return MemoryBackend()
    if parsed.scheme in ("postgresql", "postgres"):
        from dsh.persistence.postgres import PostgresBackend

        pg = config.postgres
        return PostgresBackend(
            url,
            schema=pg.schema_name,
            lease_ttl_s=pg.lease_ttl_s,
            lease_renew_s=pg.lease_renew_s,
            pool_min_size=pg.pool_min_size,
            pool_max_size=pg.pool_max_size,
            statement_timeout_ms=pg.statement_timeout_ms,
            connect_timeout_s=pg.connect_timeout_s,
            read_only=read_only,
        )
    raise ConfigError(
        f"database_url scheme {parsed.scheme!r} is not supported by this build "
        "(use sqlite:///<path>, postgresql://..., memory:, or leave it unset for JSONL under the home folder)"
    )


def _check_home_for_reading(config: Config) -> None:
    """A read-only open never creates the home.

    On the default store (JSONL under the home) a home that does not exist yet is an empty home:
    nothing has been stored there, and every read answers as it would for an empty store. With a
    `sqlite://` URL the home holds the named database, so a missing one is a missing store (one
    clear error), as any URL naming a store that does not exist.
    """
    home = config.home
    uses_home = config.database_url is None or config.database_url in ("sqlite://", "sqlite:///")
    if not uses_home:
        return
    if not os.path.lexists(home):
        if config.database_url is None:
            return
        raise StoreMisconfiguredError(
            f"no dsh home at {home}: nothing has been stored there yet (a read-only command creates no folder)",
            location=str(home),
        )
    if not os.path.isdir(home):
        raise StoreMisconfiguredError(f"the dsh home {home} is not a directory", location=str(home))


def _check_home_for_writing(config: Config) -> None:
    """A writing open of a home it cannot write fails here, once and clearly, not at every flush.

    It creates the home (0700) as the first write would, then checks the home and, when it exists,
    the sessions folder for write access.
    """
    home = config.home
    if config.database_url not in (None, "sqlite://", "sqlite:///"):
        return
    if os.path.lexists(home) and not os.path.isdir(home):
        raise StoreMisconfiguredError(f"the dsh home {home} is not a directory", location=str(home))
    try:
        os.makedirs(home, mode=0o700, exist_ok=True)
    except OSError as error:
        raise PersistenceIOError(
            f"cannot create the dsh home {home}: {error.strerror or error}", location=str(home)
        ) from error
    for folder in (home, config.sessions_dir):
        if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
            raise PersistenceIOError(f"cannot write to {folder}: permission denied", location=str(folder))


class Runtime:
    """A running set of services built from one `Config`. Create with `Runtime.open(...)`."""

    def __init__(
        self,
        config: Config,
        *,
        model: ModelClient | None = None,
        ids: IdFactory | None = None,
        clock: Callable[[], int] | None = None,
        tools: Sequence[ToolLike] = (),
        timer: Timer | None = None,
        backend: StorageBackend | None = None,
        use_cache: bool = True,
        read_only: bool = False,
        workspace: str | os.PathLike[str] | None = None,
        subagent_tools: bool = True,
        permissions: Permissions | None = None,
    ) -> None:
        from dsh.config import Config

        if not isinstance(config, Config):
            raise ConfigError("Runtime.open expects a dsh.Config")
        if type(read_only) is not bool:
            raise ConfigError("read_only must be a bool")
        if ids is not None and not isinstance(ids, IdFactory):
            raise ConfigError("ids must be an IdFactory (session, message, call and run methods)")
        self.config = config
        self._model = model
        self._owns_model = False
        self._ids: IdFactory = ids if ids is not None else RandomIds()
        self._clock = clock or wall_clock_ms
        self._timer = timer
        self._backend = backend
        self._use_cache = use_cache
        self.read_only = read_only
        """Opened read-only: nothing is created or changed, and no agent starts."""
        self._extra_tools = tuple(_as_tool(item) for item in tools)
        self._subagent_tools = subagent_tools
        self.workspace: Path | None = None
        """The workspace folder (its real path) when the runtime has the workspace tools."""
        if workspace is not None:
            real = Path(os.path.realpath(os.fspath(workspace)))
            if not real.is_dir():
                raise ConfigError(f"the workspace {os.fspath(workspace)} is not a folder")
            self.workspace = real
        self._permissions = permissions
        self._agents_md: str | None = None
        self._tools: ToolRegistry | None = None
        self._mcp: McpHub | None = None
        if self._extra_tools or self.workspace is not None:
            self._tools = self._build_tools()  # a name clash raises here, at open
        self.services = Services()
        self._opened = False
        self._closed = False
        self._unit_disposers: list[Callable[[], None]] = []
        self._closing = False

    @classmethod
    def open(
        cls,
        config: Config | None = None,
        *,
        model: ModelClient | None = None,
        ids: IdFactory | None = None,
        clock: Callable[[], int] | None = None,
        tools: Sequence[ToolLike] = (),
        timer: Timer | None = None,
        backend: StorageBackend | None = None,
        use_cache: bool = True,
        read_only: bool = False,
        workspace: str | os.PathLike[str] | None = None,
        subagent_tools: bool = True,
        permissions: Permissions | None = None,
    ) -> Runtime:
        """A runtime to enter with `async with` (config errors are raised here, before any service starts).

        Args:
            config: The configuration (default: `Config()`, read from the environment).
            model: The model client every agent uses (default: the OpenAI-compatible client built from
                `config.model` when a model is first needed). The caller keeps ownership of a client it
                passes: the runtime never closes it.
            ids: The id factory (default: random ids); a `SequentialIds` makes a run reproducible.
            clock: The epoch-ms clock of the session store (default: the wall clock).
            tools: Tools added to the runtime's default tool set; a plain function is made a tool
                with `dsh.tool`.
            timer: The persistence and cache timer (tests drive a manual one).
            backend: A storage backend to use instead of the one `config.database_url` selects.
            use_cache: Open the projection cache.
            read_only: Create and change nothing (docs/storage-format.md#read-only-opens): the
                home is not created, SQLite files open with `mode=ro`, the projection cache is
                used only when its file exists, and no agent starts. A `backend` passed in is used
                as given. A missing store raises `StoreMisconfiguredError` when entered.
            workspace: Give every agent the workspace tools (`read`, `write`, `edit`, `glob`, `grep`,
                `bash`) confined to this folder; its `AGENTS.md` joins the system prompt.
            subagent_tools: Offer the four subagent tools (`agent`, `list_agents`, `send_message`,
                `interrupt_agent`).
            permissions: What tool calls may do without asking (default: from `config.approvals`
                and `config.sandbox`).
        """
        if config is None:
            from dsh.config import Config

            config = Config()
        return cls(
            config,
            model=model,
            ids=ids,
            clock=clock,
            tools=tools,
            timer=timer,
            backend=backend,
            use_cache=use_cache,
            read_only=read_only,
            workspace=workspace,
            subagent_tools=subagent_tools,
            permissions=permissions,
        )

    # ---------------------------------------------------------------- accessors

    @property
    def tools(self) -> ToolRegistry:
        """The tools every agent of this runtime offers its model: the default set, then `tools`.

        Built on first use, so a runtime that only reads never loads the tools' argument models.
        """
        if self._tools is None:
            self._tools = self._build_tools()
        return self._tools

    def _build_tools(self) -> ToolRegistry:
        from dsh.agent.tools import ToolRegistry

        tools: list[Tool] = []
        if self._subagent_tools:
            from dsh.tools import default_tools

            tools += default_tools(self.config.subagent)
        if self.workspace is not None:
            from dsh.tools.workspace import workspace_tools

            tools += workspace_tools(self.workspace, tools=self.config.tools, sandbox=self.config.sandbox)
        if self._mcp is not None:
            tools += self._mcp.tools()
        return ToolRegistry([*tools, *self._extra_tools])

    @property
    def permissions(self) -> Permissions:
        """The permissions every agent of this runtime starts with (a subagent inherits its parent's)."""
        if self._permissions is None:
            from dsh.agent.approval import Permissions

            self._permissions = Permissions.from_config(self.config)
        return self._permissions

    @property
    def approvals(self) -> ApprovalBroker:
        """Where approval questions go (`services.approvals`): set an answerer, or decide pending requests."""
        assert self.services.approvals is not None
        return self.services.approvals

    @property
    def sessions(self) -> SessionStore:
        """The session store."""
        assert self.services.sessions is not None
        return self.services.sessions

    @property
    def persistence(self) -> PersistenceCoordinator:
        """The persistence coordinator."""
        assert isinstance(self.services.persistence, PersistenceCoordinator)
        return self.services.persistence

    @property
    def projections(self) -> ProjectionRegistry:
        """The projection registry."""
        assert self.services.projections is not None
        return self.services.projections

    @property
    def query(self) -> SessionQuery:
        """The session query service."""
        assert self.services.query is not None
        return self.services.query

    @property
    def subagents(self) -> SubagentRuntime:
        """The subagent runtime (catalog)."""
        assert self.services.subagents is not None
        return self.services.subagents

    @property
    def cache(self) -> ProjectionCache | None:
        """The projection cache, or None when it could not be opened."""
        return self.services.projection_cache

    @property
    def agents(self) -> AgentRegistry[Agent]:
        """The live agent registry."""
        assert self.services.agents is not None
        return self.services.agents

    @property
    def ids(self) -> IdFactory:
        """The id factory."""
        return self._ids

    def model_client(self) -> ModelClient:
        """The runtime's model client, building the OpenAI-compatible one from `config.model` on first use.

        Raises:
            ModelError: `MODEL_NOT_CONFIGURED` when no model was passed and no usable key is configured.
        """
        if self._model is None:
            from dsh.agent.models.openai_compat import OpenAICompatibleClient, resolve_model_settings

            self._model = OpenAICompatibleClient(resolve_model_settings(self.config.model))
            self._owns_model = True
        return self._model

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> Self:
        """Build and open every service, then start the configured MCP servers (docs/tools.md#mcp-servers).

        A server that does not start is logged (WARNING) and offers no tools; the runtime still opens.
        """
        if self._opened:
            return self
        self._opened = True
        config = self.config
        services = self.services
        if self._backend is None:
            await asyncio.to_thread(_check_home_for_reading if self.read_only else _check_home_for_writing, config)
        backend = self._backend if self._backend is not None else backend_for(config, read_only=self.read_only)
        sessions = SessionStore(clock=self._clock, id_factory=self._ids.session)
        services.sessions = sessions
        if not self.read_only:
            from dsh.agent.approval import ApprovalBroker
            from dsh.agent.instructions import read_agents_md

            services.approvals = ApprovalBroker(clock=self._clock)
            if self.workspace is not None:
                self._agents_md = await asyncio.to_thread(read_agents_md, self.workspace)
        persistence = PersistenceCoordinator(
            backend,
            sessions,
            write_batch_max_delay_ms=config.persistence.write_batch_max_delay_ms,
            timer=self._timer,
        )
        try:
            await persistence.open()
        except BaseException:
            sessions.close()
            raise
        services.persistence = persistence
        registry = ProjectionRegistry(sessions)
        services.projections = registry
        from dsh.agent.units import title_unit, tokens_unit

        # Registered before the cache opens, so its checkpoints carry them (docs/projections.md#tokens-and-titles).
        self._unit_disposers = [registry.register(title_unit()), registry.register(tokens_unit())]
        services.agents = AgentRegistry()
        services.subagents = SubagentRuntime(services, config=config.subagent, host=self)
        if self._use_cache:
            services.projection_cache = await self._open_cache(registry, sessions, persistence)
        services.query = SessionQuery(sessions, persistence, projections=registry)
        if not self.read_only and any(server.enabled for server in config.mcp.servers.values()):
            # Before any agent exists, so the servers' tools are part of every first request.
            from dsh.tools.mcp import McpHub

            self._mcp = McpHub(config.mcp)
            await self._mcp.start()
            self._tools = self._build_tools()
        return self

    async def _open_cache_storage(self, persistence: PersistenceCoordinator) -> CacheStorage | None:
        """The cache's storage: beside the sessions in PostgreSQL, else the `cache.sqlite3` file."""
        backend = persistence.backend
        if backend.name == "postgresql":
            from dsh.persistence.postgres import PostgresBackend
            from dsh.projection.cache_postgres import PostgresCacheStorage

            if isinstance(backend, PostgresBackend):
                return await PostgresCacheStorage.open(backend, read_only=self.read_only)
        path = self.config.cache_path
        if self.read_only and not await asyncio.to_thread(os.path.lexists, path):
            return None  # derived data: a read-only runtime runs without a cache it would have to create
        return await SqliteCacheStorage.open(path, read_only=self.read_only)

    async def _open_cache(
        self, registry: ProjectionRegistry, sessions: SessionStore, persistence: PersistenceCoordinator
    ) -> ProjectionCache | None:
        try:
            storage = await self._open_cache_storage(persistence)
            if storage is None:
                return None
        except ProjectionError as error:
            if self.read_only:
                _log.info("projection cache not used by this read-only run: %s", error)
            else:
                _log.warning("projection cache unavailable, running without it: %s", error)
            return None
        cache_config = ProjectionCacheConfig(
            write_every_events=self.config.cache.write_every_events,
            write_interval_ms=self.config.cache.write_interval_ms,
            close_timeout_s=self.config.cache.close_timeout_s,
            idle_ms=self.config.cache.idle_ms,
        )
        return await ProjectionCache.open(
            storage,
            registry=registry,
            sessions=sessions,
            persistence=persistence,
            config=cache_config,
            timer=self._timer,
        )

    async def aclose(self) -> None:
        """Close every service in dependency order (docs/architecture.md#open-and-close-order); idempotent.

        Admission stops and every open turn is cancelled (cause `disposed`, inboxes parked); the
        subagent runtime then drains its continuable children child-first, and the remaining agents
        close. The session store closes next, so nothing appends any more; the projection cache then
        writes its final checkpoints while the units are still registered; only then are the units
        released and the registry and persistence closed.
        """
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        self._closing = True
        services = self.services
        errors: list[Exception] = []

        async def step(action: Callable[[], object]) -> None:
            # Every step runs even when an earlier one failed; failures are raised together.
            try:
                result = action()
                if inspect.isawaitable(result):
                    await result
            except Exception as error:
                errors.append(error)

        if services.agents is not None:
            # No await between these cancels and the drain's admission cut-off below, so no tool body
            # runs in between (docs/subagents.md#the-drain-on-close).
            for agent in self.agents.list():
                agent.cancel("disposed", keep_inbox=True)
        if services.subagents is not None:
            await step(services.subagents.aclose)
        if services.agents is not None:
            await step(self._close_agents)
        if self._mcp is not None:
            await step(self._mcp.aclose)
        if services.sessions is not None:
            await step(services.sessions.aclose)
        if services.projection_cache is not None:
            await step(services.projection_cache.aclose)
        for dispose in self._unit_disposers:
            await step(dispose)
        if services.subagents is not None:
            await step(services.subagents.release_units)
        if services.projections is not None:
            await step(services.projections.close)
        if services.persistence is not None:
            await step(services.persistence.close)
        if self._owns_model and self._model is not None:
            await step(self._model.aclose)
        if errors:
            raise ExceptionGroup("runtime close failed", errors)

    async def _close_agents(self) -> None:
        """Every open turn ends `aborted` (cause `disposed`); agents leave the registry."""
        registry = self.agents
        agents = registry.list()
        await asyncio.gather(*(agent.aclose(cause="disposed") for agent in agents), return_exceptions=True)
        for agent in agents:
            registry.unregister(agent)

    # ---------------------------------------------------------------- agents

    def agent_options(self, **overrides: object) -> AgentOptions:
        """The options of a new top-level agent: `config.agent` and the model name, then `overrides`."""
        from dsh.agent.loop import AgentOptions

        settings = self.config.agent
        client_model = getattr(self._model, "model", None)
        values: dict[str, object] = {
            "model": client_model if isinstance(client_model, str) else self.config.model.model,
            "max_steps": settings.max_steps,
            "max_tokens": self.config.model.max_tokens,
            "log_chunks": settings.log_chunks,
            "cancel_grace_s": settings.cancel_grace_s,
            "permissions": self.permissions,
            "time_context": settings.time_context,
            "time_zone": settings.time_zone,
            "compaction": self.compaction_settings(),
            "model_titles": settings.model_titles,
            "structured_output_attempts": settings.structured_output_attempts,
        }
        values.update(overrides)
        if "system_prompt" not in overrides:
            values["system_prompt"] = self.system_prompt(self.tools)
        return AgentOptions(**values)  # type: ignore[arg-type]

    def compaction_settings(self) -> CompactionSettings:
        """The agents' compaction settings, from `config.compaction` (docs/agent.md#compaction)."""
        from dsh.agent.compaction import CompactionSettings

        c = self.config.compaction
        return CompactionSettings(
            auto=c.auto,
            threshold=c.threshold,
            retain=c.retain,
            context_windows=dict(c.context_windows),
            summary_max_tokens=c.summary_max_tokens,
            prune_threshold_chars=c.prune_threshold_chars,
            prune_head_chars=c.prune_head_chars,
            prune_tail_chars=c.prune_tail_chars,
        )

    @property
    def prices(self) -> dict[str, ModelPrice]:
        """The price table, model name → `ModelPrice`, from `config.prices` (DeepSeek's prices by default)."""
        from dsh.agent.usage import price_table

        return price_table(self.config.prices)

    def system_prompt(self, tools: ToolRegistry, instructions: str | None = None) -> str | None:
        """The system prompt of an agent with `tools` and its own `instructions` (docs/agent.md#instructions)."""
        from dsh.agent.instructions import agents_md_section, compose, default_system_prompt

        settings = self.config.agent
        base = settings.system_prompt
        if base is None:
            workspace = str(self.workspace) if self.workspace is not None else None
            base = default_system_prompt(tools.names(), workspace=workspace)
        agents_md = agents_md_section(self._agents_md) if self._agents_md is not None else None
        return compose(base, settings.instructions, instructions, agents_md)

    def _registry(self, tools: Sequence[ToolLike] | None) -> ToolRegistry:
        if not tools:
            return self.tools
        from dsh.agent.tools import ToolRegistry

        return ToolRegistry([*self.tools, *(_as_tool(item) for item in tools)])

    def start_agent(
        self,
        session: Session,
        *,
        options: AgentOptions | None = None,
        tools: ToolRegistry | None = None,
        keep_recorded_prompt: bool = True,
    ) -> Agent:
        """Wrap a live session in an `Agent`, register it and start its worker.

        A session whose own log records a `request/header` keeps the system prompt recorded there
        (a resumed agent goes on with the instructions it was given), unless `keep_recorded_prompt`
        is False.

        Raises:
            AgentError: `DUPLICATE_AGENT` when an agent already holds the id; `AGENT_CLOSING` while
                the runtime closes.
            ModelError: `MODEL_NOT_CONFIGURED` when no model client is available.
        """
        from dsh.agent.instructions import recorded_system_prompt
        from dsh.agent.loop import Agent

        self._refuse_closing()
        options = options if options is not None else self.agent_options()
        if keep_recorded_prompt:
            recorded = recorded_system_prompt(session)
            if recorded is not None:
                options = dataclasses.replace(options, system_prompt=recorded or None)
        agent = Agent(
            session,
            model=self.model_client(),
            tools=tools if tools is not None else self.tools,
            sessions=self.sessions,
            services=self.services,
            ids=self._ids,
            options=options,
        )
        self.agents.register(agent)
        agent.start()
        return agent

    async def create_agent(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        options: AgentOptions | None = None,
        tools: Sequence[ToolLike] | None = None,
        instructions: str | None = None,
    ) -> Agent:
        """A new top-level session with a live, registered agent.

        Args:
            session_id: The new session's id (default: a fresh one).
            cwd: The header's cwd (default: the workspace, when the runtime has one).
            options: The agent's options (default: `agent_options()` with its composed system prompt).
            tools: Tools this agent gets besides the runtime's (plain functions are made tools).
            instructions: This agent's instructions, appended to the system prompt.

        Raises:
            ModelError: `MODEL_NOT_CONFIGURED` (checked before the session is created).
            SessionError: `SESSION_ALREADY_EXISTS` or `INVALID_HEADER` for a bad id or cwd.
            ToolError: `DUPLICATE_TOOL` when one of `tools` has the name of a runtime tool.
        """
        self._refuse_closing()
        self.model_client()
        registry = self._registry(tools)
        if options is None:
            options = self.agent_options(system_prompt=self.system_prompt(registry, instructions))
        if cwd is None and self.workspace is not None:
            cwd = str(self.workspace)
        session = self.sessions.create(session_id, header=HeaderInit(cwd=cwd))
        try:
            return self.start_agent(session, options=options, tools=registry)
        except BaseException:
            self.sessions.dispose(session)
            raise

    async def resume_agent(
        self, session_id: str, *, tools: Sequence[ToolLike] | None = None, instructions: str | None = None
    ) -> Agent:
        """The live agent of a top-level session: the registered one, or the session resumed from storage.

        A session whose header says `origin: "subagent"` is refused: its parent drives it through
        subagent delivery, never a generic route (docs/catalog.md#rows-on-the-wire). A resumed
        agent keeps the system prompt its log records, unless `instructions` are given (the prompt
        is then composed again with them). `tools` are added to the runtime's for a resumed agent.

        Raises:
            AgentError: `SESSION_OWNED_BY_SUBAGENT` for a subagent session.
            SessionPersistenceError: `SESSION_NOT_FOUND`, `SESSION_CORRUPT`, ... from the resume read.
        """
        self._refuse_closing()
        agent = self.agents.get(session_id)
        live = self.sessions.get(session_id)
        header = agent.session.header if agent is not None else live.header if live is not None else None
        if header is not None and header.origin == "subagent":
            raise _owned_by_subagent(session_id)
        if agent is not None:
            return agent
        registry = self._registry(tools)
        options = None
        if instructions is not None:
            options = self.agent_options(system_prompt=self.system_prompt(registry, instructions))
        if live is not None:
            return self.start_agent(live, options=options, tools=registry, keep_recorded_prompt=instructions is None)
        self.model_client()
        prepared = await self.persistence.prepare(session_id)
        session = prepared.session
        if session.header.origin == "subagent":
            await prepared.close()
            raise _owned_by_subagent(session_id)
        try:
            prepared.publish()
        except BaseException:
            await prepared.close()
            raise
        try:
            return self.start_agent(session, options=options, tools=registry, keep_recorded_prompt=instructions is None)
        except BaseException:
            self.sessions.dispose(session)
            raise

    async def run(
        self,
        prompt: str,
        session_id: str | None = None,
        *,
        source: Source | None = None,
        cwd: str | None = None,
        output_schema: Mapping[str, Any] | None = None,
    ) -> TurnResult:
        """Send `prompt` to a new top-level agent (or the agent of `session_id`) and return its turn's result.

        With `output_schema` (an object-rooted JSON Schema) the agent must finish by calling the
        `structured_output` tool with an object the schema accepts; `TurnResult.structured` is that
        object (docs/agent.md#structured-output).

        Raises:
            ValueError: `output_schema` is not an object-rooted JSON Schema.
        """
        structured = None
        extra: list[Tool] = []
        if output_schema is not None:
            from dsh.agent.structured import STRUCTURED_OUTPUT_INSTRUCTION, StructuredOutput

            structured = StructuredOutput(output_schema, max_attempts=self.config.agent.structured_output_attempts)
            extra.append(structured)
        instructions = STRUCTURED_OUTPUT_INSTRUCTION if structured is not None else None
        if session_id is None:
            agent = await self.create_agent(cwd=cwd, tools=extra or None, instructions=instructions)
        else:
            agent = await self.resume_agent(session_id, tools=extra or None, instructions=instructions)
        unbind = structured.bind(agent) if structured is not None else None
        if source is None:
            from dsh.agent.messages import UserSource

            source = UserSource()
        try:
            message_id = await agent.send(prompt, source)
            result = await agent.turn_result(message_id)
        finally:
            if unbind is not None:
                unbind()
        if structured is not None and structured.captured:
            result = dataclasses.replace(result, structured=structured.value)
        return await self._with_tokens(agent, result)

    async def _with_tokens(self, agent: Agent, result: TurnResult) -> TurnResult:
        """`result` with the turn's and the session's priced token totals."""
        from dsh.agent.usage import turn_totals

        prices = self.prices
        turn = turn_totals([(agent.options.model, result.usage)] if result.usage is not None else [], prices)
        try:
            session = await self.tokens(agent.id)
        except Exception as error:  # the turn's result stands without the session total
            _log.debug('session "%s": no token total: %s', agent.id, error)
            session = None
        return dataclasses.replace(result, tokens=turn, session_tokens=session)

    async def compact(self, session_id: str, *, signal: AbortSignal | None = None) -> CompactionResult | None:
        """Compact a top-level session now (its agent is resumed when it is not live); None when there is nothing
        to summarise (docs/agent.md#compaction).

        Raises:
            AgentError: `COMPACTION_FAILED` (the session stays usable, the attempt is in its log),
                `SESSION_OWNED_BY_SUBAGENT`, `AGENT_CLOSING`.
            SessionPersistenceError: `SESSION_NOT_FOUND`, ... from the resume read.
        """
        agent = await self.resume_agent(session_id)
        return await agent.compact(signal=signal)

    async def tokens(self, session_id: str, *, tree: bool = False) -> TokenTotals:
        """A session's token total, priced; with `tree`, summed over it and every subagent below it (the catalog).

        Raises:
            SessionPersistenceError: `SESSION_NOT_FOUND`, ... from a cold read.
        """
        from dsh.agent.accounting import session_tokens

        prices = self.prices
        total = await session_tokens(self.services, session_id, prices)
        if tree:
            for entry in await self.subagents.list_descendants(session_id):
                total = total + await session_tokens(self.services, entry.entry.id, prices)
        return total

    async def listed_facts(self, header: SessionHeader) -> ListedFacts:
        """The title and token total a list shows for `header`, with zero log reads (None where unknown)."""
        from dsh.agent.accounting import listed_facts

        return await listed_facts(self.services, header, self.prices)

    async def settle(self, timeout: float | None = 60) -> None:  # noqa: ASYNC109 - the documented signature
        """Wait until every agent is idle with nothing claimable in its inbox, and every settled
        subagent has been disposed and its parent notice queued.

        Raises:
            TimeoutError: when that does not happen within `timeout` seconds.
        """
        subagents = self.services.subagents
        async with asyncio.timeout(timeout):
            while True:
                agents = self.agents.list()
                await asyncio.gather(*(agent.wait_idle() for agent in agents))
                if subagents is not None:
                    await subagents.settled()
                # A turn (or a notice) may have sent work to another agent meanwhile: settle again until stable.
                if all(not agent.busy for agent in self.agents.list()):
                    return

    def _refuse_closing(self) -> None:
        if self.read_only:
            raise ConfigError("this runtime was opened read-only and starts no agents")
        if self._closing:
            raise AgentError("the runtime is closing and starts no agents", code="AGENT_CLOSING")

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.aclose()
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


# Shown under the name users import (docs/architecture.md#public-names).
Runtime.__module__ = "dsh"
