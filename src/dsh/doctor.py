"""`dsh doctor`: check the home folder and read every stored session, changing nothing.

Layer: top (beside `dsh.runtime`, whose read-only open it uses; the CLI only renders the report).
The checks (docs/cli.md#dsh-doctor):

* **home**: the home folder exists and is a readable directory (not writable: a warning); on the
  default store a home that does not exist yet is an empty home, which is ok;
* **free-space**: at least 100 MiB free where the home lives (less: a warning);
* **cache**: `cache.sqlite3`, when present, is a regular file (its type is checked before any open,
  so a FIFO never blocks) and passes `PRAGMA quick_check` opened with `mode=ro`;
* **serve-token**: the `dsh serve` token file, when present, is a regular file with mode 0600;
* **model-key**, **model-url**: whether a model key is configured (never shown; none is reported but
  is not a problem, since the demo and scripted runs need none) and that the base URL is an http(s)
  URL with a host; with `online`,
  **model-online** calls `GET /models` through the OpenAI client;
* **store**: the session store opens read-only (`Runtime.open(config, read_only=True)`), and a
  SQLite store file passes `quick_check` too;
* **log-encodings** (JSONL stores, only when it warns): the store holds logs of both encodings
  (`session.jsonl` and `session.jsonl.zstd`), which dsh reads but the TypeScript harness refuses;
* **postgres**, **sync-commit**, **leases** (PostgreSQL stores): the server answers (its version),
  the schema and its version, a warning when `synchronous_commit` is off, and the writer leases
  held and expired (an expired one is a warning: a crashed writer's, taken over by the next resume);
  the home folder is then optional and the cache is checked in the database, not as a file;
* **sessions**: every stored session is listed (an entry the listing cannot read is a problem of
  kind `unreadable`) and observed once, cold, through the query service, with at most
  `subagent.cold_read_concurrency` reads in flight. Problems, one per finding:

  * `unreadable` (fail): the listing or the read fails (a damaged header or log, a log that is
    not a regular file, an unreadable folder);
  * `subagent-without-identity` (fail): a subagent session has no descriptor of its own, so the
    catalog shows it as a `corrupt` row;
  * `torn-tail` (warn): the log ends in a torn tail (the next resume removes it and keeps any
    complete records beside the log);
  * `orphan` (warn): `parentSession` names a session that is not stored;
  * `upstream-header` (warn): a header only the TypeScript harness accepts (a Windows `cwd`).

Nothing is repaired, no cache row is written, no writer lock is taken, and no file, folder or
table is created (the read-only open). The report's status is `fail` when any check or problem
fails (the CLI exits 7), else `warn` or `ok` (exit 0).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from urllib.parse import unquote, urlparse

from dsh.config import Config
from dsh.errors import DshError
from dsh.persistence.base import DamagedSession, StoredSessionInfo
from dsh.persistence.errors import SessionPersistenceError
from dsh.persistence.headers import upstream_only_reason
from dsh.projection.cache_storage import quick_check
from dsh.runtime import Runtime
from dsh.subagent.listing import folded_identity

__all__ = ["FREE_SPACE_WARN_BYTES", "Check", "DoctorReport", "Problem", "Progress", "run_doctor"]

Status = Literal["ok", "warn", "fail"]
Severity = Literal["warn", "fail"]
Progress = Callable[[int, int], None]
"""Called with `(sessions read, sessions to read)` after each observation (and once with `(0, n)`)."""

FREE_SPACE_WARN_BYTES: Final = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Check:
    """One check of the home or its stores: `name`, `ok|warn|fail`, and what was found."""

    name: str
    status: Status
    detail: str

    def to_json(self) -> dict[str, object]:
        """Wire form `{name, status, detail}`."""
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding about one stored session (or one entry that could not be read).

    Attributes:
        kind: `unreadable`, `subagent-without-identity`, `torn-tail`, `orphan` or `upstream-header`.
        severity: `fail` (the session is damaged) or `warn`.
        session_id: The session id when known (for an unreadable entry: the id its folder names).
        path: The log or folder path when the store has one.
        reason: What is wrong, for people.
        fix: A command that fixes it, when one exists.
    """

    kind: str
    severity: Severity
    session_id: str | None
    path: str | None
    reason: str
    fix: str | None = None

    def to_json(self) -> dict[str, object]:
        """Wire form in camelCase; `fix` only when there is one."""
        out: dict[str, object] = {
            "kind": self.kind,
            "severity": self.severity,
            "sessionId": self.session_id,
            "path": self.path,
            "reason": self.reason,
        }
        if self.fix is not None:
            out["fix"] = self.fix
        return out


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """Everything one doctor run found."""

    home: str
    checks: tuple[Check, ...]
    problems: tuple[Problem, ...]
    sessions: int
    """How many stored sessions were listed and observed."""

    @property
    def status(self) -> Status:
        """`fail` when any check or problem fails, else `warn` when any warns, else `ok`."""
        states = [check.status for check in self.checks] + [problem.severity for problem in self.problems]
        if "fail" in states:
            return "fail"
        return "warn" if "warn" in states else "ok"

    def to_json(self) -> dict[str, object]:
        """Wire form: `{home, status, sessions, checks: [...], problems: [...]}`."""
        return {
            "home": self.home,
            "status": self.status,
            "sessions": self.sessions,
            "checks": [check.to_json() for check in self.checks],
            "problems": [problem.to_json() for problem in self.problems],
        }


# ---------------------------------------------------------------- home and files


def _home_checks(home: Path) -> list[Check]:
    if not home.exists():
        return [Check("home", "fail", f"{home} does not exist (nothing has been stored there)")]
    if not home.is_dir():
        return [Check("home", "fail", f"{home} is not a directory")]
    if not os.access(home, os.R_OK | os.X_OK):
        return [Check("home", "fail", f"{home} is not readable")]
    checks = [
        Check("home", "ok", f"{home} is a readable, writable directory")
        if os.access(home, os.W_OK)
        else Check("home", "warn", f"{home} is readable but not writable (commands that write will fail)")
    ]
    free = shutil.disk_usage(home).free
    shown = f"{free / 1024**3:.1f} GiB free"
    if free < FREE_SPACE_WARN_BYTES:
        checks.append(Check("free-space", "warn", f"only {free / 1024**2:.0f} MiB free (below 100 MiB)"))
    else:
        checks.append(Check("free-space", "ok", shown))
    return checks


def _sqlite_check(name: str, path: Path, what: str) -> Check:
    """`PRAGMA quick_check` of a SQLite file opened `mode=ro` (blocking).

    The file type is checked first: SQLite would open a FIFO and block forever, and a symbolic link
    is refused by every open of the cache and the store anyway
    (docs/storage-format.md#damage-stays-visible).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Check(name, "ok", f"no {what} at {path} (nothing to check)")
    except OSError as error:
        return Check(name, "fail", f"{what} {path} cannot be checked: {error.strerror}")
    if stat.S_ISLNK(info.st_mode):
        return Check(name, "fail", f"{what} {path} is a symbolic link; dsh refuses to open it")
    if not stat.S_ISREG(info.st_mode):
        return Check(name, "fail", f"{what} {path} is not a regular file")
    try:
        result = quick_check(path)
    except sqlite3.Error as error:
        if _wal_needs_a_writable_folder(path, error):
            # SQLite reads a WAL database only through its `-shm` index; when that file is absent
            # and the folder is not writable, no reader can open the database, damaged or not.
            # The cache is optional (read-only commands run without it), so that is a warning.
            return Check(
                name,
                "warn" if name == "cache" else "fail",
                f"{what} {path} cannot be read here: its folder is not writable and SQLite needs to "
                f"create {path.name}-shm to read it (run as a user who can write {path.parent})",
            )
        return Check(name, "fail", f"{what} {path} cannot be checked: {error}")
    if result != "ok":
        return Check(name, "fail", f"{what} {path} fails quick_check: {result}")
    return Check(name, "ok", f"{what} {path} passes quick_check")


def _wal_needs_a_writable_folder(path: Path, error: sqlite3.Error) -> bool:
    """Whether `error` is SQLite refusing a WAL database whose `-shm` file it may not create."""
    name = getattr(error, "sqlite_errorname", "")
    if not name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        return False
    return not os.path.lexists(f"{path}-shm") and not os.access(path.parent, os.W_OK)


def _sqlite_store_path(config: Config) -> Path | None:
    url = config.database_url
    if url is None or urlparse(url).scheme != "sqlite":
        return None
    raw = unquote(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else ""
    return Path(raw).expanduser().resolve() if raw else config.home / "sessions.sqlite3"


def _is_postgres(config: Config) -> bool:
    url = config.database_url
    return url is not None and urlparse(url).scheme in ("postgresql", "postgres")


def _nonempty_regular(path: Path) -> bool:
    """Whether `path` is a regular file holding bytes (the only store file worth a quick_check).

    Anything else in the store's place (nothing, 0 bytes, a FIFO, a folder, a link) is the store
    check's finding: the read-only open reports it without opening it.
    """
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size > 0


def _file_checks(config: Config) -> list[Check]:
    if _is_postgres(config):
        # Sessions and the projection cache live in the database; the home only holds the API token.
        if not os.path.lexists(config.home):
            return [Check("home", "ok", f"{config.home} does not exist (not needed: sessions live in PostgreSQL)")]
        return _home_checks(config.home)
    if config.database_url is None and not os.path.lexists(config.home):
        # A home that does not exist yet is an empty home: nothing went wrong, nothing is stored.
        detail = f"{config.home} does not exist yet (nothing has been stored; the first dsh run creates it)"
        return [Check("home", "ok", detail)]
    checks = _home_checks(config.home)
    checks.append(_sqlite_check("cache", config.cache_path, "projection cache"))
    store = _sqlite_store_path(config)
    if store is not None and _nonempty_regular(store):
        checks.append(_sqlite_check("store-file", store, "SQLite session store"))
    return checks


# ---------------------------------------------------------------- sessions


def _unreadable_entry(item: DamagedSession) -> Problem:
    path = item.location if os.sep in item.location else None
    return Problem("unreadable", "fail", item.session_id, path, f"{item.code}: {item.message}")


class _SessionReader:
    """Observes every listed session once, cold, and turns what it finds into problems."""

    def __init__(self, rt: Runtime, known: set[str], progress: Progress | None, total: int) -> None:
        self.rt = rt
        self.known = known
        self.progress = progress
        self.total = total
        self.done = 0
        self.log_names: Counter[str] = Counter()

    async def read(self, row: StoredSessionInfo, slots: asyncio.Semaphore) -> list[Problem]:
        header = row.header
        path = self.rt.persistence.locate(header)
        if path is not None:
            self.log_names[os.path.basename(path)] += 1
        problems = self._header_problems(row, path)
        async with slots:
            problems.extend(await self._observe(row, path))
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)
        return problems

    def _header_problems(self, row: StoredSessionInfo, path: str | None) -> list[Problem]:
        header = row.header
        found: list[Problem] = []
        upstream = upstream_only_reason(header)
        if upstream is not None:
            found.append(Problem("upstream-header", "warn", header.id, path, upstream))
        parent = header.parent_session
        if parent is not None and parent not in self.known:
            found.append(
                Problem("orphan", "warn", header.id, path, f'parentSession "{parent}" names no stored session')
            )
        return found

    async def _observe(self, row: StoredSessionInfo, path: str | None) -> list[Problem]:
        header = row.header
        try:
            observation = await self.rt.query.observe_session(header.id)
        except DshError as error:
            return [Problem("unreadable", "fail", header.id, path, f"{error.code}: {error.message}")]
        found: list[Problem] = []
        if observation.torn_tail:
            found.append(
                Problem(
                    "torn-tail",
                    "warn",
                    header.id,
                    path,
                    "the log ends in a torn tail; the next resume removes it and keeps any complete "
                    "records it holds beside the log",
                )
            )
        if header.origin == "subagent":
            try:
                identity = folded_identity(self.rt.projections, observation.events, observation.inherited_event_count)
            except Exception:
                identity = None
            if identity is None:
                found.append(
                    Problem(
                        "subagent-without-identity",
                        "fail",
                        header.id,
                        path,
                        "a subagent session without its own subagent/descriptor: the catalog lists it "
                        "as a corrupt diagnostic row",
                    )
                )
        return found


def _encodings_check(log_names: Counter[str]) -> Check | None:
    """A warning when a JSONL store holds logs of both encodings (docs/storage-format.md#jsonl-layout)."""
    if len([name for name in log_names if name.startswith("session.jsonl")]) < 2:
        return None
    counts = ", ".join(f"{count} {name}" for name, count in sorted(log_names.items()))
    return Check(
        "log-encodings",
        "warn",
        f"the store holds logs of both encodings ({counts}): dsh reads each, but the TypeScript harness "
        "refuses such a root; set persistence.compression to the encoding it is configured with",
    )


async def _session_problems(rt: Runtime, progress: Progress | None) -> tuple[int, list[Problem], Check | None]:
    listing = await rt.persistence.list()
    problems = [_unreadable_entry(item) for item in listing.damaged]
    rows = list(listing.rows)
    known = {row.header.id for row in rows} | {item.session_id for item in listing.damaged if item.session_id}
    reader = _SessionReader(rt, known, progress, len(rows))
    if progress is not None:
        progress(0, len(rows))
    slots = asyncio.Semaphore(rt.config.subagent.cold_read_concurrency)
    found = await asyncio.gather(*(reader.read(row, slots) for row in rows))
    for row_problems in found:
        problems.extend(row_problems)
    return len(rows), problems, _encodings_check(reader.log_names)


def _token_check(home: Path) -> Check:
    from dsh.server.security import TOKEN_FILE

    path = home / TOKEN_FILE
    try:
        info = path.lstat()
    except FileNotFoundError:
        return Check("serve-token", "ok", f"no API token at {path} yet (dsh serve creates it)")
    except OSError as error:
        return Check("serve-token", "fail", f"{path} cannot be read: {error.strerror}")
    if not stat.S_ISREG(info.st_mode):
        return Check("serve-token", "fail", f"{path} is not a regular file; remove it and run dsh serve --rotate-token")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return Check("serve-token", "fail", f"{path} has mode {mode:04o}; dsh serve refuses it (fix: chmod 600 {path})")
    return Check("serve-token", "ok", f"{path} has mode {mode:04o}")


async def _model_checks(config: Config, *, online: bool) -> list[Check]:
    """The model settings, never showing the key; `online` asks the endpoint for its models."""
    from dsh.agent.errors import ModelError
    from dsh.agent.models.openai_compat import resolve_model_settings

    url = config.model.base_url
    try:
        settings = resolve_model_settings(config.model)
    except ModelError as error:
        if "not an http(s) URL" in error.message:
            return [Check("model-url", "fail", f"the model base URL {url!r} is not an http(s) URL with a host")]
        return [
            Check("model-url", "ok", f"{url} is well-formed"),
            # Not a warning: a home used only with `dsh demo` and `--script` scripts needs no key.
            Check(
                "model-key",
                "ok",
                "no model key is set: only keyless runs work (dsh demo, --script); real models need "
                "DSH_MODEL_API_KEY, or DEEPSEEK_API_KEY for DeepSeek",
            ),
        ]
    variable = {"api_key": "DSH_MODEL_API_KEY", "deepseek_api_key": "DEEPSEEK_API_KEY"}.get(settings.key_source, "")
    checks = [
        Check("model-url", "ok", f"{settings.base_url} is well-formed"),
        Check("model-key", "ok", f"a key is set ({variable or settings.key_source}) for {settings.host}"),
    ]
    if online:
        import openai

        client = openai.AsyncOpenAI(
            base_url=settings.base_url, api_key=settings.api_key.get_secret_value(), max_retries=0, timeout=30.0
        )
        try:
            page = await client.models.list()
            checks.append(Check("model-online", "ok", f"GET /models answered with {len(page.data)} models"))
        except Exception as error:
            status = getattr(error, "status_code", None)
            shown = f"HTTP {status}" if status is not None else type(error).__name__
            checks.append(Check("model-online", "fail", f"GET /models failed: {shown}"))
        finally:
            await client.close()
    return checks


async def _postgres_checks(rt: Runtime) -> list[Check]:
    """The PostgreSQL store's server, schema and leases (nothing for other stores)."""
    backend = rt.persistence.backend
    if backend.name != "postgresql":
        return []
    from dsh.persistence.postgres import PostgresBackend

    if not isinstance(backend, PostgresBackend):
        return []
    facts = await backend.diagnostics()
    version = facts["schema_version"]
    schema = f'schema "{facts["schema"]}" ' + (f"version {version}" if version is not None else "not created yet")
    checks = [Check("postgres", "ok", f"{backend.location}: PostgreSQL {facts['server_version']}, {schema}")]
    if str(facts["synchronous_commit"]).lower() == "off":
        checks.append(
            Check("sync-commit", "warn", "synchronous_commit is off: a committed append can be lost in a server crash")
        )
    leases = facts["leases"]
    expired = [lease for lease in leases if lease.expired]
    held = [lease for lease in leases if not lease.expired]
    shown = "; ".join(
        f"{lease.session_id} by {lease.holder} (generation {lease.generation}, "
        f"{'expired' if lease.expired else 'expires'} {lease.expires_at.isoformat(timespec='seconds')})"
        for lease in [*held, *expired][:10]
    )
    detail = f"{len(held)} held, {len(expired)} expired" + (f": {shown}" if shown else "")
    if len(leases) > 10:
        detail += f" (and {len(leases) - 10} more)"
    # An expired lease is what a crashed writer leaves: the next resume of that session takes it over.
    checks.append(Check("leases", "warn" if expired else "ok", detail))
    return checks


async def run_doctor(config: Config, *, progress: Progress | None = None, online: bool = False) -> DoctorReport:
    """Run every check over `config`'s home and stores, read-only (`online` also asks the model endpoint).

    Raises:
        ConfigError: The configuration itself is invalid (an unsupported database URL).
    """
    checks = await asyncio.to_thread(_file_checks, config)
    checks.append(await asyncio.to_thread(_token_check, config.home))
    checks.extend(await _model_checks(config, online=online))
    problems: list[Problem] = []
    sessions = 0
    home_usable = checks[0].status != "fail"
    if home_usable or _sqlite_store_path(config) is not None or _is_postgres(config):
        try:
            async with Runtime.open(config, read_only=True) as rt:
                sessions, problems, encodings = await _session_problems(rt, progress)
                checks.append(Check("store", "ok", f"{rt.persistence.backend.name} store: {sessions} sessions read"))
                if encodings is not None:
                    checks.append(encodings)
                checks.extend(await _postgres_checks(rt))
        except SessionPersistenceError as error:
            checks.append(Check("store", "fail", f"{error.code}: {error.message}"))
    return DoctorReport(str(config.home), tuple(checks), tuple(problems), sessions)
