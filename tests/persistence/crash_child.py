"""Child process of the crash and writer-lock tests: streams turns into one persisted session until killed.

Run as `python crash_child.py <backend> <store path> <session id> <seed> [<mode>]`, where backend is
`jsonl-zstd`, `jsonl-raw` or `sqlite`. It opens a `SessionStore` + `PersistenceCoordinator`, resumes
the session with `prepare` when it is stored (else creates it), and streams seeded-random turns
(turn/start, user message, steps with chunks, assistant messages carrying tool-call blocks,
tool/call, tool/result, step/end, turn/end) with periodic flushes and background batches.

Reports go to stdout, one unbuffered line each, written synchronously right after the fact, so the
parent can compare what is on disk with what happened before the kill:

* `E <seq> <sha256 of the event's JSON>` after every event enters the session (restored events
  included). No write of an event can start before its line is out: both happen on the loop thread
  and no `await` separates the append from the report.
* `F <n>` after a flush returned: every event with `seq < n` is durable.
* `READY <n>` once the session is live; `HELD <holder>` (then exit 3) when another process is the
  session's writer; `DONE` when mode `bounded` finished its turns.

The program imports nothing from the `tests` package, so it runs by path with only `dsh` installed.
The parent's half of the protocol (`Reports`, `CHILD`) lives in `tests/persistence/helpers.py`,
which reuses `open_backend` from here so both sides open a store the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
from typing import Any

import orjson

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import LeaseHeldError, SessionNotFoundError
from dsh.persistence.jsonl import JsonlBackend
from dsh.session import HeaderInit, Session, SessionEvent, SessionStore


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def _report(event: SessionEvent) -> None:
    _emit(f"E {event.seq} {hashlib.sha256(orjson.dumps(event)).hexdigest()}")


def open_backend(kind: str, path: str) -> Any:
    """The backend under test for `kind` (`jsonl-zstd`, `jsonl-raw` or `sqlite`) over the store at `path`."""
    if kind == "jsonl-zstd":
        return JsonlBackend(path, compression="zstd")
    if kind == "jsonl-raw":
        return JsonlBackend(path, compression="none")
    if kind == "sqlite":
        from dsh.persistence.sqlite import SqliteBackend

        return SqliteBackend(path)
    raise SystemExit(f"unknown backend {kind!r}")


class Streamer:
    """Appends seeded-random, valid turns to one live session and reports every event."""

    def __init__(self, store: SessionStore, session: Session, rng: random.Random) -> None:
        self.store = store
        self.session = session
        self.rng = rng
        self.turn = sum(1 for event in session.events if event.type == "turn/start")
        self.since_flush = 0

    async def add(self, kind: str, data: Any, **kwargs: Any) -> SessionEvent:
        event = self.session.append(kind, data, **kwargs)
        _report(event)
        self.since_flush += 1
        if self.since_flush >= self.rng.randint(3, 25):
            self.since_flush = 0
            covered = self.session.seq
            await self.store.flush(self.session)
            _emit(f"F {covered}")
        elif self.rng.random() < 0.3:
            await asyncio.sleep(0)  # let background batches run between appends
        return event

    def _text(self) -> str:
        size = self.rng.choice((8, 40, 300, 3000, 20000))
        return self.rng.randbytes(size // 2 + 1).hex()[:size]

    async def one_turn(self) -> None:
        turn = self.turn
        self.turn += 1
        rng = self.rng
        await self.add("turn/start", {"turn": turn})
        user = {"id": f"u{turn}", "role": "user", "content": [{"type": "text", "text": self._text()}]}
        await self.add("user/message", {**user, "source": {"kind": "user"}})
        for step in range(1, rng.randint(1, 3) + 1):
            await self.add("step/start", {"turn": turn, "step": step})
            for _ in range(rng.randint(0, 6)):
                chunk = {"type": "text-delta", "text": self._text()}
                await self.add("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk})
            calls = [f"call-{turn}-{step}-{index}" for index in range(rng.randint(0, 2))]
            content: list[dict[str, Any]] = [{"type": "text", "text": self._text()}]
            content += [{"type": "tool-call", "id": call, "name": "lookup", "arguments": "{}"} for call in calls]
            message = {
                "id": f"a{turn}-{step}",
                "role": "assistant",
                "content": content,
                "source": {"kind": "model", "provider": "scripted", "model": "crash"},
            }
            await self.add("assistant/message", {"turn": turn, "step": step, "message": message})
            for call in calls:
                started = await self.add(
                    "tool/call", {"turn": turn, "step": step, "callId": call, "name": "lookup", "arguments": "{}"}
                )
                if rng.random() < 0.2:
                    continue  # a call whose result never arrives before the step ends
                block = {"type": "tool-result", "toolCallId": call, "content": [{"type": "text", "text": self._text()}]}
                result = {
                    "id": f"r-{call}",
                    "role": "user",
                    "source": {"kind": "tool", "callId": call},
                    "content": [block],
                }
                await self.add(
                    "tool/result", {"turn": turn, "step": step, "message": result}, source_event_seqs=[started.seq]
                )
            await self.add("step/end", {"turn": turn, "step": step})
        await self.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


async def main(kind: str, path: str, session_id: str, seed: int, mode: str) -> int:
    rng = random.Random(seed)
    store = SessionStore()
    coordinator = PersistenceCoordinator(
        open_backend(kind, path), store, write_batch_max_delay_ms=rng.choice((1, 5, 20))
    )
    await coordinator.open()
    try:
        prepared = await coordinator.prepare(session_id)
        session = prepared.publish()
    except SessionNotFoundError:
        session = store.create(session_id, header=HeaderInit(cwd="/crash"))
    except LeaseHeldError as error:
        _emit(f"HELD {error.holder}")
        return 3
    for event in session.events:
        _report(event)
    _emit(f"READY {session.seq}")
    streamer = Streamer(store, session, rng)
    turns = 2 if mode == "bounded" else 1_000_000
    for _ in range(turns):
        await streamer.one_turn()
    covered = session.seq
    await store.flush(session)
    _emit(f"F {covered}")
    if mode == "bounded":
        _emit("DONE")
        # Wait for the parent's word before releasing the writer lock.
        await asyncio.to_thread(sys.stdin.readline)
    await store.aclose()
    await coordinator.close()
    return 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    raise SystemExit(
        asyncio.run(
            main(
                arguments[0],
                arguments[1],
                arguments[2],
                int(arguments[3]),
                arguments[4] if len(arguments) > 4 else "stream",
            )
        )
    )
