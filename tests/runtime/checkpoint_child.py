"""Child process of the checkpoint-policy crash test: subagent children flushed turn by turn, then killed.

Run as `python checkpoint_child.py <home>`. It opens a `Runtime` on the JSONL home whose projection
cache writes a checkpoint every 12 dirty events (the interval and idle triggers ten minutes away, so
only the count fires), creates the children `c0`..`c4` of parent `P` (subagent sessions whose first
event is their descriptor) and runs 1, 2, 4, 5 and 7 turns of five events in them, each turn flushed
as an agent flushes after `turn/end`. Every flush is durable when it returns; a checkpoint lands
after the turn in which a child's twelfth dirty event since its last one arrived. Then, with no cache
write in flight, it reports and waits to be killed (a SIGKILL: no disposal, no close):

* `FLUSHES <n>`: the flushes it made; `PUTS <n>`: the cache records it stored (counted at the
  storage, so every checkpoint is counted once);
* `SEQ <child> <last seq>` for each child, then `READY`.

The program imports nothing from the `tests` package, so it runs by path with only `dsh` installed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from dsh.config import CacheConfig, Config
from dsh.runtime import Runtime
from dsh.session import HeaderInit, Session
from dsh.subagent.descriptor import snapshot_descriptor

TURNS = {"c0": 1, "c1": 2, "c2": 4, "c3": 5, "c4": 7}
COUNT = 12
FAR_MS = 600_000


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def _turn(session: Session, turn: int) -> None:
    """Five events: turn start, a user message, two text chunks, turn end."""
    session.append("turn/start", {"turn": turn})
    text = [{"type": "text", "text": "go"}]
    message = {"id": f"u{turn}", "role": "user", "content": text, "source": {"kind": "user"}}
    session.append("user/message", message)
    for text in ("working", "done"):
        session.append("assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text", "text": text}})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


async def main(home: str) -> None:
    config = Config(home=home, cache=CacheConfig(write_every_events=COUNT, write_interval_ms=FAR_MS, idle_ms=FAR_MS))
    async with Runtime.open(config) as rt:
        cache = rt.cache
        assert cache is not None, "the projection cache did not open"
        puts = 0
        put = cache.storage.put

        async def counted(session_id: Any, record: Any) -> None:
            nonlocal puts
            await put(session_id, record)
            puts += 1

        cache.storage.put = counted  # type: ignore[method-assign]
        flushes = 0
        children = []
        for child_id, turns in TURNS.items():
            header = HeaderInit(cwd="/work/p", parent_session="P", origin="subagent", delegation_depth=1)
            session = rt.sessions.create(child_id, header=header)
            session.append("subagent/descriptor", snapshot_descriptor("continuable", provider="spawn", label=child_id))
            children.append(session)
            for turn in range(1, turns + 1):
                _turn(session, turn)
                await rt.sessions.flush(session)
                flushes += 1
        while cache._tasks:  # every triggered checkpoint has landed
            await asyncio.gather(*list(cache._tasks))
        _emit(f"FLUSHES {flushes}")
        _emit(f"PUTS {puts}")
        for session in children:
            _emit(f"SEQ {session.id} {session.seq - 1}")
        _emit("READY")
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
