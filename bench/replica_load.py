"""Replica load: 16 clients against two `dsh serve` replicas on one PostgreSQL store, beside one replica.

Each variant gets a fresh PostgreSQL schema and runs `dsh serve --database-url postgresql://... --script`
processes exactly as an operator starts them (a shared token in `DSH_SERVE_TOKEN`). Each client owns one
session, created on replica `i % n`; it follows the session's push stream on replica `(i + 1) % n` and
sends its k-th prompt through replica `(i + k) % n`, waiting for the turn's `turn/end` frame before the
next. With two replicas every stream is served by a replica that does not run the turn (frames travel
through the store) and every other prompt lands on the replica without the lease (it is forwarded as a
request row). The latency of a turn is from sending its prompt to its `turn/end` frame on the stream.

At the end every client compares the `session/event` seqs of its stream with the stored events (streamed
chunks are not forwarded): frames lost, duplicated and out of order must all be 0.

Reported per variant: turns, turns/s, p50/p99/max turn latency (ms), frames and the three counts; the
throughput ratio two replicas / one. Needs `DSH_BENCH_POSTGRES_URL` (or `DSH_TEST_POSTGRES_URL`); without
one the benchmark reports that it was skipped. Run: `python -m bench replica_load`;
`DSH_BENCH_REPLICA_LOAD_S=5` for a quick run, `DSH_BENCH_REPLICA_LOAD_CLIENTS` to change the client count.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import QUICK, count_target, info, print_table, write_json

DURATION_S = float(os.environ.get("DSH_BENCH_REPLICA_LOAD_S", "5" if QUICK else "20"))
CLIENTS = int(os.environ.get("DSH_BENCH_REPLICA_LOAD_CLIENTS", "16"))
GUARD_S = 120.0
"""Hang guard for a server start or a turn's end."""
ANSWER = "A scripted answer from the replica load benchmark, streamed in a few chunks."


def _url() -> str | None:
    return os.environ.get("DSH_BENCH_POSTGRES_URL") or os.environ.get("DSH_TEST_POSTGRES_URL")


class Replica:
    """One `dsh serve` process on the variant's schema."""

    def __init__(self, name: str, workdir: Path, url: str, schema: str, token: str) -> None:
        self.name, self.workdir, self.db, self.schema, self.token = name, workdir, url, schema, token
        self.url = ""
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, script: Path) -> None:
        """Start the server and wait for its URL."""
        env = {**os.environ, "DSH_PG_SCHEMA": self.schema, "DSH_SERVE_TOKEN": self.token, "NO_COLOR": "1"}
        with (self.workdir / f"{self.name}.log").open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "dsh",
                "--home",
                str(self.workdir / f"home-{self.name}"),
                "serve",
                "--port",
                "0",
                "--script",
                str(script),
                "--database-url",
                self.db,
                cwd=str(self.workdir),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        stdout = self.process.stdout

        async def announced() -> str:
            while True:
                line = (await stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"replica {self.name} ended before serving")
                if line.startswith("http://"):
                    return line.strip().rstrip("/")

        self.url = await asyncio.wait_for(announced(), GUARD_S)

    async def stop(self) -> None:
        """SIGTERM, then wait."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), GUARD_S)
        except TimeoutError:
            process.kill()
            await process.wait()


@dataclass
class ClientResult:
    """What one client measured and saw."""

    session_id: str = ""
    start: int = -1
    latencies_ms: list[float] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    resets: int = 0


async def _sse(response: Any, result: ClientResult, ended: asyncio.Queue[int], positioned: asyncio.Event) -> None:
    event, data = "", ""
    async for line in response.aiter_lines():
        if line == "":
            if event == "session/event":
                frame = json.loads(data)
                result.seqs.append(frame["seq"])
                if frame["type"] == "turn/end":
                    ended.put_nowait(int(frame.get("turn", 0)))
            elif event == "reset":
                result.resets += 1
            event, data = "", ""
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id" and not positioned.is_set():
            result.start = int(value)
            positioned.set()
        elif name == "event":
            event = value
        elif name == "data":
            data = value


async def _client(index: int, replicas: list[Replica], deadline: float) -> ClientResult:
    import httpx

    n = len(replicas)
    result = ClientResult()
    headers = {"Authorization": f"Bearer {replicas[0].token}"}
    async with httpx.AsyncClient(headers=headers, timeout=GUARD_S) as http:
        created = await http.post(f"{replicas[index % n].url}/api/v1/sessions")
        created.raise_for_status()
        result.session_id = session_id = created.json()["session"]["id"]
        ended: asyncio.Queue[int] = asyncio.Queue()
        positioned = asyncio.Event()
        watcher = replicas[(index + 1) % n]
        async with http.stream("GET", f"{watcher.url}/api/v1/stream", params={"sessionId": session_id}) as response:
            reader = asyncio.ensure_future(_sse(response, result, ended, positioned))
            try:
                await asyncio.wait_for(positioned.wait(), GUARD_S)
                turn = 0
                while time.perf_counter() < deadline:
                    turn += 1
                    via = replicas[(index + turn) % n]
                    sent = time.perf_counter()
                    answer = await http.post(
                        f"{via.url}/api/v1/sessions/{session_id}/prompt",
                        json={"content": [{"type": "text", "text": f"turn {turn}"}]},
                    )
                    if answer.status_code != 202:
                        raise RuntimeError(f"prompt through {via.name}: {answer.status_code} {answer.text}")
                    while await asyncio.wait_for(ended.get(), GUARD_S) != turn:
                        pass
                    result.latencies_ms.append((time.perf_counter() - sent) * 1000)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
    return result


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _stored_seqs(url: str, schema: str, session_id: str, after: int) -> list[int]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            f'SELECT seq FROM "{schema}".events WHERE session_id = %s AND seq > %s '
            "AND type <> 'assistant/chunk' ORDER BY seq",
            (session_id, after),
        )
        return [int(row[0]) for row in await cursor.fetchall()]


async def _drop(url: str, schema: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _variant(url: str, count: int) -> dict[str, Any]:
    schema = f"dsh_bench_{secrets.token_hex(6)}"
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="dsh-replica-load-") as folder:
        workdir = Path(folder)
        script = workdir / "script.json"
        track = {"steps": [], "on": [{"text": ANSWER}]}
        script.write_text(json.dumps({"version": 1, "model": "bench", "agents": {"main": track}}), encoding="utf-8")
        replicas = [Replica(f"r{i}", workdir, url, schema, token) for i in range(count)]
        try:
            for replica in replicas:  # one after the other: the first creates the schema
                await replica.start(script)
            started = time.perf_counter()
            deadline = started + DURATION_S
            results = await asyncio.gather(*(_client(i, replicas, deadline) for i in range(CLIENTS)))
            elapsed = time.perf_counter() - started
            lost = duplicated = disordered = 0
            for result in results:
                expected = await _stored_seqs(url, schema, result.session_id, result.start)
                seen = result.seqs
                duplicated += len(seen) - len(set(seen))
                disordered += sum(1 for before, after in itertools.pairwise(seen) if after <= before)
                lost += len(set(expected) - set(seen))
            latencies = [value for result in results for value in result.latencies_ms]
            return {
                "replicas": count,
                "clients": CLIENTS,
                "turns": len(latencies),
                "seconds": elapsed,
                "turns_per_s": len(latencies) / elapsed,
                "p50_ms": _percentile(latencies, 0.5),
                "p99_ms": _percentile(latencies, 0.99),
                "max_ms": max(latencies, default=float("nan")),
                "frames": sum(len(result.seqs) for result in results),
                "lost": lost,
                "duplicated": duplicated,
                "out_of_order": disordered,
                "resets": sum(result.resets for result in results),
            }
        finally:
            for replica in replicas:
                await replica.stop()
            await _drop(url, schema)


def main() -> None:
    """Run one replica, then two, and report both with the throughput ratio."""
    url = _url()
    if url is None:
        print("replica_load: skipped (set DSH_BENCH_POSTGRES_URL or DSH_TEST_POSTGRES_URL)")
        write_json("replica_load", {"skipped": "no PostgreSQL URL", "targets": []})
        return
    one = asyncio.run(_variant(url, 1))
    two = asyncio.run(_variant(url, 2))
    header = ["replicas", "turns", "turns/s", "p50 ms", "p99 ms", "max ms", "frames", "lost", "dup", "disorder"]
    rows = [
        [
            run["replicas"],
            run["turns"],
            round(run["turns_per_s"], 1),
            round(run["p50_ms"], 1),
            round(run["p99_ms"], 1),
            round(run["max_ms"], 1),
            run["frames"],
            run["lost"],
            run["duplicated"],
            run["out_of_order"],
        ]
        for run in (one, two)
    ]
    print_table(f"{CLIENTS} clients for {DURATION_S:g} s", header, rows)
    ratio = two["turns_per_s"] / one["turns_per_s"] if one["turns_per_s"] else float("nan")
    print(f"throughput two replicas / one: {ratio:.2f}x")
    bad = {name: one[name] + two[name] for name in ("lost", "duplicated", "out_of_order", "resets")}
    targets = [
        info("replica-throughput-1", "turns/s, one replica", round(one["turns_per_s"], 1), unit="/s"),
        info("replica-throughput-2", "turns/s, two replicas", round(two["turns_per_s"], 1), unit="/s"),
        info("replica-throughput-ratio", "turns/s two replicas / one", round(ratio, 2), unit="x"),
        info("replica-p50-2", "turn latency p50, two replicas", round(two["p50_ms"], 1), unit="ms"),
        info("replica-p99-2", "turn latency p99, two replicas", round(two["p99_ms"], 1), unit="ms"),
        count_target("replica-lost", "frames lost (both variants)", bad["lost"], "0", bad["lost"] == 0),
        count_target(
            "replica-duplicated", "frames duplicated (both variants)", bad["duplicated"], "0", bad["duplicated"] == 0
        ),
        count_target(
            "replica-out-of-order",
            "frames out of order (both variants)",
            bad["out_of_order"],
            "0",
            bad["out_of_order"] == 0,
        ),
        count_target("replica-resets", "reset frames (both variants)", bad["resets"], "0", bad["resets"] == 0),
    ]
    write_json("replica_load", {"variants": [one, two], "ratio": ratio, "targets": targets})
