"""`Runtime`: the composition root that wires the default services from a typed `Config`.

Layer: top (above every service layer; the CLI and the server use it). `async with
Runtime.open(config) as rt:` builds, in order, the session store, persistence (JSONL+zstd under the
home folder by default, SQLite for `sqlite:///...`, in-memory for `memory:`), the projection
registry, the projection cache (SQLite file; if it refuses to open, the runtime logs one warning
and runs without it), the query service and the subagent runtime. It closes in the one order every
hand-built stack must follow too: subagents → sessions (dispose, which triggers the cache's
mandatory writes) → cache → unit registrations → registry → persistence.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import unquote, urlparse

from dsh.config import Config
from dsh.errors import ConfigError
from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.projection.cache import ProjectionCache, ProjectionCacheConfig
from dsh.projection.cache_storage import SqliteCacheStorage
from dsh.projection.errors import ProjectionError
from dsh.projection.registry import ProjectionRegistry
from dsh.query.service import SessionQuery
from dsh.services import Services
from dsh.session.ids import new_session_id
from dsh.session.store import SessionStore, wall_clock_ms
from dsh.subagent.runtime import SubagentRuntime
from dsh.timer import Timer

__all__ = ["Runtime", "backend_for"]

_log = logging.getLogger(__name__)


def backend_for(config: Config) -> StorageBackend:
    """The storage backend `config` selects (JSONL+zstd under `home/sessions` by default)."""
    url = config.database_url
    if url is None:
        from dsh.persistence.jsonl import JsonlBackend

        return JsonlBackend(config.sessions_dir)
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        from dsh.persistence.sqlite import SqliteBackend

        # SQLAlchemy's convention: `sqlite:///relative.db`, `sqlite:////absolute/path.db`;
        # `sqlite://` alone selects the default file in the home folder.
        raw = unquote(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else ""
        path = Path(raw).expanduser().resolve() if raw else config.home / "sessions.sqlite3"
        return SqliteBackend(path)
    if parsed.scheme == "memory":
        from dsh.persistence.memory import MemoryBackend

        return MemoryBackend()
    raise ConfigError(
        f"database_url scheme {parsed.scheme!r} is not supported by this build "
        "(use sqlite:///<path>, memory:, or leave it unset for JSONL under the home folder)"
    )


class Runtime:
    """A running set of services built from one `Config`. Create with `Runtime.open(...)`."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Callable[[], int] | None = None,
        id_factory: Callable[[], str] | None = None,
        timer: Timer | None = None,
        backend: StorageBackend | None = None,
        use_cache: bool = True,
    ) -> None:
        if not isinstance(config, Config):
            raise ConfigError("Runtime.open expects a dsh.Config")
        self.config = config
        self._clock = clock or wall_clock_ms
        self._id_factory = id_factory or new_session_id
        self._timer = timer
        self._backend = backend
        self._use_cache = use_cache
        self.services = Services()
        self._opened = False
        self._closed = False

    @classmethod
    def open(
        cls,
        config: Config | None = None,
        *,
        clock: Callable[[], int] | None = None,
        id_factory: Callable[[], str] | None = None,
        timer: Timer | None = None,
        backend: StorageBackend | None = None,
        use_cache: bool = True,
    ) -> Runtime:
        """A runtime to enter with `async with` (config errors are raised here, before any service starts)."""
        return cls(
            config if config is not None else Config(),
            clock=clock,
            id_factory=id_factory,
            timer=timer,
            backend=backend,
            use_cache=use_cache,
        )

    # ---------------------------------------------------------------- accessors

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

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> Self:
        """Build and open every service."""
        if self._opened:
            return self
        self._opened = True
        config = self.config
        services = self.services
        backend = self._backend if self._backend is not None else backend_for(config)
        sessions = SessionStore(clock=self._clock, id_factory=self._id_factory)
        services.sessions = sessions
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
        services.subagents = SubagentRuntime(services, config=config.subagent)
        if self._use_cache:
            services.projection_cache = await self._open_cache(registry, sessions, persistence)
        services.query = SessionQuery(sessions, persistence, projections=registry)
        return self

    async def _open_cache(
        self, registry: ProjectionRegistry, sessions: SessionStore, persistence: PersistenceCoordinator
    ) -> ProjectionCache | None:
        try:
            storage = await SqliteCacheStorage.open(self.config.cache_path)
        except ProjectionError as error:
            _log.warning("projection cache unavailable, running without it: %s", error)
            return None
        cache_config = ProjectionCacheConfig(
            write_every_events=self.config.cache.write_every_events,
            write_interval_ms=self.config.cache.write_interval_ms,
            close_timeout_s=self.config.cache.close_timeout_s,
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

        The subagent runtime and the session store close first, so nothing appends any more; the
        projection cache then writes its final checkpoints while the units are still registered; only
        then are the units released and the registry and persistence closed.
        """
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
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

        if services.subagents is not None:
            await step(services.subagents.aclose)
        if services.sessions is not None:
            await step(services.sessions.aclose)
        if services.projection_cache is not None:
            await step(services.projection_cache.aclose)
        if services.subagents is not None:
            await step(services.subagents.release_units)
        if services.projections is not None:
            await step(services.projections.close)
        if services.persistence is not None:
            await step(services.persistence.close)
        if errors:
            raise ExceptionGroup("runtime close failed", errors)

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
