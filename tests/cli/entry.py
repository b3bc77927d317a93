"""The real `dsh` entry point in a child process, and the stores the command-line tests read.

`dsh_process` runs the `dsh` console script installed beside the test's interpreter (or `python -m
dsh` where there is none) in a fresh process: exit codes, stdout and stderr are what a person
sees, and a command that would hang fails the test at the guard instead of stalling the suite.
`StoreUnderTest` is one home on one of the three backends (JSONL, SQLite, PostgreSQL in a
throw-away schema): the global options and environment the command needs, and a `Config` for the
writing runtime that fills it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh.config import Config, PostgresConfig
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing.postgres import ThrowawaySchemas

__all__ = [
    "BACKENDS",
    "GUARD_S",
    "StoreUnderTest",
    "doctor_problems",
    "dsh_command",
    "dsh_process",
    "open_store",
    "unlisted_count",
    "write_family",
]

GUARD_S = 60.0
"""How long a child process may run: only a hang guard, never a timing assertion."""

BACKENDS = ("jsonl", "sqlite", "postgres")

_UNLISTED = re.compile(r"^(\d+) stored sessions? could not be read; run dsh .*doctor$", re.MULTILINE)


def dsh_command() -> list[str]:
    """The `dsh` console script installed beside this interpreter, else `python -m dsh`."""
    script = Path(sys.executable).with_name("dsh")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dsh"]


def dsh_process(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = GUARD_S
) -> subprocess.CompletedProcess[str]:
    """`dsh ARGS` in a fresh process (stdin closed, output captured, bounded by `timeout`)."""
    full = dict(os.environ)
    full.update(env or {})
    argv = [*dsh_command(), *args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=timeout,
        check=False,
        env=full,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def unlisted_count(stderr: str) -> int:
    """The N of `N stored sessions could not be read; run dsh ... doctor` (0 without that line)."""
    match = _UNLISTED.search(stderr)
    return int(match.group(1)) if match else 0


def doctor_problems(stdout: str) -> list[dict[str, Any]]:
    """The `problems` of a `dsh doctor --json` report."""
    problems: list[dict[str, Any]] = json.loads(stdout)["problems"]
    return problems


@dataclass(frozen=True, slots=True)
class StoreUnderTest:
    """One home on one backend: what a command needs to reach it, and the writing runtime's config."""

    kind: str
    home: Path
    url: str | None = None
    schema: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def args(self) -> list[str]:
        """The global options naming this store, to put before the command."""
        extra = ["--database-url", self.url] if self.url is not None else []
        return ["--home", str(self.home), *extra]

    def config(self) -> Config:
        """The config of a runtime on this store."""
        if self.schema is not None:
            return Config(home=self.home, database_url=self.url, postgres=PostgresConfig(schema_name=self.schema))
        return Config(home=self.home, database_url=self.url)

    def run(self, *args: str, timeout: float = GUARD_S) -> subprocess.CompletedProcess[str]:
        """`dsh <global options> ARGS` on this store, in a fresh process."""
        return dsh_process(*self.args, *args, env=self.env, timeout=timeout)

    @property
    def sqlite_path(self) -> Path:
        """The SQLite store file (`sqlite://` selects the default file in the home)."""
        return self.home / "sessions.sqlite3"


def open_store(kind: str, tmp_path: Path, pg_schemas: ThrowawaySchemas | None = None) -> StoreUnderTest:
    """A fresh store of `kind` (`jsonl`, `sqlite` or `postgres`; the last needs `pg_schemas`)."""
    home = tmp_path / "home"
    if kind == "jsonl":
        return StoreUnderTest(kind, home)
    if kind == "sqlite":
        return StoreUnderTest(kind, home, "sqlite://")
    if kind == "postgres":
        assert pg_schemas is not None
        schema = pg_schemas.new()
        return StoreUnderTest(kind, home, pg_schemas.url, schema, {"DSH_PG_SCHEMA": schema})
    raise ValueError(kind)


async def write_family(store: StoreUnderTest, children: Sequence[str], *, one_shot: Sequence[str] = ()) -> None:
    """Parent `P` with one settled, cold child per id (label = the id), written by a real runtime.

    Children are continuable, their descriptor the first event of their creation seed, except those
    in `one_shot`, whose descriptor is appended inside their first turn. None is a fork, so once the
    runtime closed the projection cache holds every child's identity and the catalog answers from
    it without reading the log (the cache rung, docs/cli.md#when-damage-shows).
    """
    async with Runtime.open(store.config()) as rt:
        parent = rt.sessions.create("P")
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        sessions = [parent]
        for index, child_id in enumerate(children):
            header = HeaderInit(parent_session="P", origin="subagent", delegation_depth=1, created_at=10 + index)
            if child_id in one_shot:
                child = rt.sessions.create(child_id, header=header)
                child.append("turn/start", {"turn": 1})
                child.append("subagent/descriptor", snapshot_descriptor("one-shot", provider="spawn", label=child_id))
                child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            else:
                descriptor = snapshot_descriptor("continuable", provider="spawn", label=child_id)
                seed = [{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}]
                child = rt.sessions.create(child_id, header=header, seed=seed)
                child.append("turn/start", {"turn": 1})
                child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            sessions.append(child)
        for session in sessions:
            await rt.sessions.flush(session)
