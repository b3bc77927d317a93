"""One host of the two-host tests: a writing `Runtime` on a shared PostgreSQL schema, driven over pipes.

Run as `python host_child.py URL SCHEMA LEASE_TTL_S LEASE_RENEW_S HOME [MACHINE]`. With `MACHINE`,
the process plays a machine of that name: its lease holder names a boot id and pid namespace of
its own (a private function of the holder module is replaced), so hosts of different names never
judge each other's processes, as real separate machines cannot. Without it, the host is this
machine, as `dsh` itself is. The process opens a
`Runtime` whose backend is the PostgreSQL store in `SCHEMA` (the lease settings are short so tests
can let leases expire), then prints one JSON line `{"ok": true, "ready": true, "holder": ..., "pid":
...}` and serves one JSON request per stdin line, answering each with one JSON line on stdout:
`{"ok": true, ...}` or, for a dsh error, `{"ok": false, "code": ..., "message": ...}`. Requests:

* `{"op": "create", "id", "parent"?, "depth"?, "mode"?, "label"?, "created_at", "turns", "open_step"?}`: a new
  session (a subagent child with a descriptor when `parent` is given) with `turns` closed turns, an
  open step after them when asked, flushed; answers the stored event count;
* `{"op": "append", "id", "title", "count"}`: `count` `session/title` events titled `title` on the
  live session, then a flush;
* `{"op": "resume", "id"}`: the resume path (prepare, publish); answers the repaired event types;
* `{"op": "children", "parent"}`: `list_children` rows as JSON, and how many entries were unlisted;
* `{"op": "sessions"}`: the ids the store lists, and the damaged entries;
* `{"op": "quit"}`: close the runtime (its errors are reported, not raised) and exit 0.

The host never reads the database behind the runtime's back: the tests check rows with their own SQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from dsh.config import Config, PostgresConfig
from dsh.errors import DshError
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing.stored_logs import append_closed_turn, append_open_step


def _failure(error: BaseException) -> dict[str, Any]:
    """The answer for a failed request: the first dsh error's code (groups are searched)."""
    pending = [error]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, DshError):
            return {"ok": False, "code": current.code, "message": str(current)}
    return {"ok": False, "code": type(error).__name__, "message": str(error)}


class HostChild:
    """The requests a test can send, over one open runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def create(self, request: dict[str, Any]) -> dict[str, Any]:
        parent = request.get("parent")
        seed = None
        header = HeaderInit(created_at=request["created_at"])
        if parent is not None:
            descriptor = snapshot_descriptor(request["mode"], provider="spawn", label=request.get("label"))
            seed = [{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}]
            header = HeaderInit(
                created_at=request["created_at"],
                parent_session=parent,
                origin="subagent",
                delegation_depth=request.get("depth", 1),
            )
        session = self.rt.sessions.create(request["id"], header=header, seed=seed)
        for turn in range(1, request["turns"] + 1):
            append_closed_turn(session, turn)
        if request.get("open_step"):
            append_open_step(session, request["turns"] + 1)
        await self.rt.sessions.flush(session)
        return {"ok": True, "events": len(session.events)}

    async def append(self, request: dict[str, Any]) -> dict[str, Any]:
        session = self.rt.sessions.get(request["id"])
        if session is None:
            return {"ok": False, "code": "NOT_LIVE", "message": f"{request['id']} is not live in this host"}
        for _ in range(request["count"]):
            session.append("session/title", {"title": request["title"], "messageSeqs": [], "source": {"kind": "user"}})
        await self.rt.sessions.flush(session)
        return {"ok": True, "events": len(session.events)}

    async def resume(self, request: dict[str, Any]) -> dict[str, Any]:
        prepared = await self.rt.persistence.prepare(request["id"])
        try:
            session = prepared.publish()
        except BaseException:
            await prepared.close()
            raise
        return {"ok": True, "types": [event.type for event in session.events]}

    async def children(self, request: dict[str, Any]) -> dict[str, Any]:
        reports: list[Any] = []
        rows = await self.rt.subagents.list_children(request["parent"], report=reports.append)
        unlisted = reports[-1].unlisted if reports else 0
        return {"ok": True, "rows": [row.to_json() for row in rows], "unlisted": unlisted}

    async def sessions(self, request: dict[str, Any]) -> dict[str, Any]:
        listing = await self.rt.persistence.list()
        return {
            "ok": True,
            "ids": [str(row.header.id) for row in listing.rows],
            "damaged": [[item.session_id, item.code] for item in listing.damaged],
        }


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


async def _serve(url: str, schema: str, ttl_s: float, renew_s: float, home: Path) -> None:
    config = Config(
        home=home,
        database_url=url,
        postgres=PostgresConfig(schema_name=schema, lease_ttl_s=ttl_s, lease_renew_s=renew_s),
    )
    rt = Runtime.open(config)
    await rt.start()
    host = HostChild(rt)
    backend: Any = rt.persistence.backend
    _say({"ok": True, "ready": True, "holder": backend.holder, "pid": os.getpid()})
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        request = json.loads(line)
        if request["op"] == "quit":
            break
        try:
            answer = await getattr(host, request["op"])(request)
        except Exception as error:
            answer = _failure(error)
        _say(answer)
    try:
        await rt.aclose()
    except Exception as error:
        _say({"ok": True, "closed": False, "close_error": _failure(error)})
    else:
        _say({"ok": True, "closed": True})


def _play_machine(name: str) -> None:
    """Make this process's lease holders name a machine of their own (`name`), not this one."""
    from dsh.persistence.postgres import _holder

    fake = (str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.hosts.test")), "0:0")
    _holder._machine = lambda: fake  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    """Serve requests until `quit` or the end of stdin."""
    url, schema, ttl_s, renew_s, home, *machine = argv
    if machine and machine[0]:
        _play_machine(machine[0])
    asyncio.run(_serve(url, schema, float(ttl_s), float(renew_s), Path(home)))


if __name__ == "__main__":
    main(sys.argv[1:])
