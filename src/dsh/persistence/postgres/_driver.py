"""The PostgreSQL driver boundary: lazy imports, URL masking, and which driver errors are transient.

Layer: persistence (private to `dsh.persistence.postgres`). `psycopg` and `psycopg_pool` are
optional dependencies (the `postgres` extra) and heavy to import, so nothing here imports them at
module level: `load_driver()` imports them the first time a PostgreSQL backend is constructed, and
`import dsh` never does. Every other module of the package receives the loaded `Driver`.

Transient errors are the ones a retry on another connection can cure: the connection broke (the
server restarted, `pg_terminate_backend`, a network blip) or the server rolled the transaction back
to resolve a conflict (serialization failure, deadlock). A statement timeout is *not* transient: it
means the database is too slow or a lock is held too long, and retrying would only double the wait.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Final
from urllib.parse import SplitResult, urlsplit, urlunsplit

from dsh.errors import ConfigError

__all__ = [
    "SCHEMES",
    "Driver",
    "check_schema_name",
    "first_line",
    "load_driver",
    "mask_url",
    "quoted",
]

SCHEMES: Final = frozenset({"postgresql", "postgres"})
"""URL schemes that select the PostgreSQL store."""

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_TRANSIENT_STATES: Final = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "57P01",  # admin_shutdown (pg_terminate_backend, a server shutting down)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (the server is starting up)
    }
)


@dataclass(frozen=True, slots=True)
class Driver:
    """The loaded driver modules.

    Attributes:
        psycopg: The `psycopg` module.
        pool: The `psycopg_pool` module.
    """

    psycopg: ModuleType
    pool: ModuleType

    def is_driver_error(self, error: BaseException) -> bool:
        """Whether `error` came from the driver or the pool (and must be translated)."""
        return isinstance(error, self.psycopg.Error | self.pool.PoolTimeout)

    def is_transient(self, error: BaseException) -> bool:
        """Whether a retry on another connection may succeed (see the module docs)."""
        if isinstance(error, self.pool.PoolTimeout):
            return False  # the pool already waited for a connection as long as it may
        if not isinstance(error, self.psycopg.OperationalError):
            return False
        state = getattr(getattr(error, "diag", None), "sqlstate", None)
        if state is None:
            # No SQLSTATE: the client lost the connection (or never had one) rather than the
            # server refusing the statement.
            return True
        return state in _TRANSIENT_STATES or state.startswith("08")


def load_driver() -> Driver:
    """Import `psycopg` and `psycopg_pool` (first use only; later calls hit the module cache).

    Raises:
        ConfigError: `CONFIG_INVALID` when the `postgres` extra is not installed.
    """
    try:
        import psycopg
        import psycopg_pool
    except ImportError as error:
        raise ConfigError(
            "a postgresql:// database URL needs the PostgreSQL driver: pip install 'pydsh[postgres]' "
            f"(psycopg 3 with its pool); importing it failed: {error}"
        ) from error
    return Driver(psycopg=psycopg, pool=psycopg_pool)


def check_schema_name(name: object) -> str:
    """A schema name safe to splice into SQL as a quoted identifier.

    Raises:
        ConfigError: `CONFIG_INVALID` unless it is lower-case letters, digits and `_`, starting
            with a letter or `_`, at most 63 characters (PostgreSQL's identifier limit).
    """
    if type(name) is not str or not _SCHEMA_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid PostgreSQL schema name {name!r}: use lower-case letters, digits and _, starting with a "
            "letter or _, at most 63 characters"
        )
    return name


def quoted(schema: str) -> str:
    """The schema as a quoted SQL identifier (the name was checked by `check_schema_name`)."""
    return f'"{schema}"'


def mask_url(url: str) -> str:
    """The URL with its password (in the user part or a `password=` parameter) replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable database URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostinfo}"
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing to hide; rebuilding could drop an empty authority (`sqlite:///...`)
    return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, parts.fragment))


def first_line(error: BaseException, *, secret: str | None = None) -> str:
    """The driver's message as one line (libpq spreads a connection failure over several), secret-free."""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip()) or type(error).__name__
    if secret:
        text = text.replace(secret, "***")
    return text
