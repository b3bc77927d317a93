"""Driving host processes for the two-host tests: start, request, signal, stop.

A `ChildHost` is one OS process running `host_child.py` on the shared schema (its own runtime,
backend, pool and lease holder name). Requests and answers are JSON lines over its stdin and stdout;
its stderr (log lines) goes to a file so a chatty host can never block on a full pipe, and its tail
is shown when the host ends unexpectedly. Every wait is bounded by `GUARD_S`, which only catches
hangs. Also here: the families the tests write, SQL for the rows they check, and a whole-schema dump.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.postgres.helpers import sql

CHILD = Path(__file__).with_name("host_child.py")
GUARD_S = 60.0
NOT_A_DESCRIPTOR = '{"version":2,"mode":"forgotten"}'
"""JSON the tests write over a descriptor row: the log reads, the child has no identity (`corrupt`)."""
NOT_JSON = '{"damaged": '
"""Text the tests write over an event row: the log cannot be read at all (`unavailable`)."""


class ChildHost:
    """One host process; `holder` is its backend's lease holder name."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.name = name
        self.process = process
        self.stderr = stderr
        self.holder = ""
        self.pid = process.pid

    @classmethod
    async def start(
        cls,
        name: str,
        url: str,
        schema: str,
        workdir: Path,
        *,
        ttl_s: float = 30.0,
        renew_s: float = 10.0,
        machine: str | None = "",
    ) -> ChildHost:
        """Start the process and wait for its ready line.

        `machine`: the machine the host plays (its lease holder names that machine's boot id and
        pid namespace); "" (the default) plays a machine named like the host, so two hosts are two
        machines; None is this real machine, where a host judges another host's processes.
        """
        played = name if machine == "" else (machine or "")
        stderr = workdir / f"{name}.stderr"
        with stderr.open("wb") as sink:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(CHILD),
                url,
                schema,
                str(ttl_s),
                str(renew_s),
                str(workdir / f"{name}-home"),
                played,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=sink,
            )
        host = cls(name, process, stderr)
        ready = await host._answer()
        assert ready.get("ready"), ready
        host.holder = str(ready["holder"])
        return host

    def _tail(self) -> str:
        try:
            return self.stderr.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    async def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), GUARD_S)
        if not line:
            code = await asyncio.wait_for(self.process.wait(), GUARD_S)
            pytest.fail(f"host {self.name} ended (exit {code}) without answering: {self._tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its answer (`ok` may be false)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        await asyncio.wait_for(self.process.stdin.drain(), GUARD_S)
        return await self._answer()

    async def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request that must succeed."""
        answer = await self.request(op, **fields)
        assert answer["ok"], f"host {self.name}: {op} failed: {answer}"
        return answer

    async def refused(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request that must fail; returns the failure (`code`, `message`)."""
        answer = await self.request(op, **fields)
        assert not answer["ok"], f"host {self.name}: {op} should have failed: {answer}"
        return answer

    def send_signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the host process."""
        self.process.send_signal(sig)

    async def kill(self) -> None:
        """SIGKILL the host and wait until it is gone (nothing of its own shutdown runs)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(self.process.wait(), GUARD_S)

    async def quit(self) -> dict[str, Any]:
        """Ask the host to close its runtime and exit; returns its close report (exit status 0)."""
        assert self.process.stdin is not None
        self.process.stdin.write(b'{"op": "quit"}\n')
        await asyncio.wait_for(self.process.stdin.drain(), GUARD_S)
        closed = await self._answer()
        code = await asyncio.wait_for(self.process.wait(), GUARD_S)
        assert code == 0, f"host {self.name} exited {code}: {self._tail()}"
        return closed

    async def cleanup(self) -> None:
        """Make sure the process is gone (resumed first, if it was stopped)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGCONT)
            await self.kill()


@asynccontextmanager
async def host_group(url: str, schema: str, workdir: Path) -> AsyncIterator[Callable[..., Awaitable[ChildHost]]]:
    """A factory of hosts on `schema`; every host still running at the end is killed."""
    started: list[ChildHost] = []

    async def start(name: str, **options: Any) -> ChildHost:
        host = await ChildHost.start(name, url, schema, workdir, **options)
        started.append(host)
        return host

    try:
        yield start
    finally:
        for host in started:
            await host.cleanup()


async def write_family(host: ChildHost, parent: str, base: int) -> None:
    """A parent and its children, written by `host`, created in this order at `base`, `base + 1`, ...

    `<parent>-c1` (continuable, "alpha", with a child of its own), `<parent>-c2` (one-shot, no
    label), `<parent>-c3` and `<parent>-c4` (continuable, "gamma" and "delta": the tests damage
    them) and `<parent>-c1-g`.
    """
    await host.ok("create", id=parent, created_at=base, turns=1)
    children = [
        ("c1", "continuable", "alpha"),
        ("c2", "one-shot", None),
        ("c3", "continuable", "gamma"),
        ("c4", "continuable", "delta"),
    ]
    for offset, (suffix, mode, label) in enumerate(children, start=1):
        await host.ok(
            "create", id=f"{parent}-{suffix}", parent=parent, mode=mode, label=label, created_at=base + offset, turns=1
        )
    await host.ok(
        "create", id=f"{parent}-c1-g", parent=f"{parent}-c1", depth=2, mode="one-shot", created_at=base + 9, turns=1
    )


def family_ids(parent: str) -> list[str]:
    """The ids `write_family` writes, in creation order."""
    return [parent, f"{parent}-c1", f"{parent}-c2", f"{parent}-c3", f"{parent}-c4", f"{parent}-c1-g"]


async def damage_family(url: str, schema: str, parent: str) -> None:
    """Damage `write_family`'s children in storage: c3's descriptor is `NOT_A_DESCRIPTOR`, c4's is `NOT_JSON`.

    c2 loses its cache row only, so that every kind of cold row is read: c1 is answered by its
    writer's checkpoint, c2 by a cold read of a sound log, c3 and c4 by cold reads of damaged ones.
    """
    await forget_cache(url, schema, f"{parent}-c2")
    await damage_descriptor(url, schema, f"{parent}-c3", NOT_A_DESCRIPTOR)
    await damage_descriptor(url, schema, f"{parent}-c4", NOT_JSON)


def expected_rows(parent: str) -> list[dict[str, Any]]:
    """The catalog rows of `write_family`'s parent read from storage after `damage_family`."""
    return [
        {
            "kind": "child",
            "id": f"{parent}-c1",
            "mode": "continuable",
            "label": "alpha",
            "activity": "inactive",
            "hasChildren": True,
        },
        {"kind": "child", "id": f"{parent}-c2", "mode": "one-shot", "activity": "inactive", "hasChildren": False},
        {"kind": "diagnostic", "id": f"{parent}-c3", "reason": "corrupt"},
        {"kind": "diagnostic", "id": f"{parent}-c4", "reason": "unavailable"},
    ]


async def damage_descriptor(url: str, schema: str, session_id: str, data: str) -> None:
    """Overwrite the stored descriptor row (seq 0) with `data`, and bump the revision.

    The revision moves as it would for any change of the stored log. The session's projection-cache
    row is deleted too (`forget_cache`): a cache row answers for the prefix it checkpointed without
    reading the log (docs/catalog.md#cached-identity), so the damage is what a reader meets when no
    checkpoint covers it, as after a host that died before its first checkpoint.
    """
    await sql(
        url, "UPDATE {s}.events SET data = %s WHERE session_id = %s AND seq = 0", [data, session_id], schema=schema
    )
    await sql(url, "UPDATE {s}.sessions SET revision = revision + 1 WHERE id = %s", [session_id], schema=schema)
    await forget_cache(url, schema, session_id)


async def forget_cache(url: str, schema: str, session_id: str) -> None:
    """Delete the session's projection-cache row, so the next listing must read its log."""
    await sql(url, "DELETE FROM {s}.projection_cache WHERE session_id = %s", [session_id], schema=schema)


async def cached_ids(url: str, schema: str) -> list[str]:
    """The session ids that have a projection-cache row."""
    rows = await sql(url, 'SELECT session_id FROM {s}.projection_cache ORDER BY session_id COLLATE "C"', schema=schema)
    return [str(row[0]) for row in rows]


async def equals(found: Awaitable[object], expected: object) -> bool:
    """Whether the awaited value equals `expected` (a predicate for `tests.postgres.helpers.until`)."""
    return await found == expected


async def event_rows(url: str, schema: str, session_id: str) -> list[tuple[Any, ...]]:
    """Every column of the session's event rows, by seq."""
    return await sql(url, "SELECT * FROM {s}.events WHERE session_id = %s ORDER BY seq", [session_id], schema=schema)


async def titles(url: str, schema: str, session_id: str) -> list[str]:
    """The titles of the session's stored `session/title` events, by seq."""
    rows = await sql(
        url,
        "SELECT data FROM {s}.events WHERE session_id = %s AND type = 'session/title' ORDER BY seq",
        [session_id],
        schema=schema,
    )
    return [json.loads(row[0])["title"] for row in rows]


async def lease_expired(url: str, schema: str, session_id: str) -> bool:
    """Whether the session's lease row has expired by the database clock."""
    rows = await sql(
        url, "SELECT expires_at <= now() FROM {s}.session_leases WHERE session_id = %s", [session_id], schema=schema
    )
    return bool(rows and rows[0][0])


async def dump_schema(url: str, schema: str) -> dict[str, Any]:
    """Every relation of the schema and every row of every table, sorted: equal dumps, equal store."""
    relations = await sql(
        url,
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s ORDER BY 1",
        [schema],
    )
    out: dict[str, Any] = {"relations": relations}
    for name, kind in relations:
        if kind == "r":
            rows = await sql(url, f'SELECT * FROM {{s}}."{name}"', schema=schema)
            out[name] = sorted(rows, key=repr)
    return out
