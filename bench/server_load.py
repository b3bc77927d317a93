"""Server load: 32 clients for 30 s against `dsh serve --script` on loopback, each following its session's push stream.

The server runs as its own process (`dsh serve --port 0 --script ...` on a fresh home, JSONL storage,
the access log written to a file), exactly as a user starts it; this process runs the clients on one
event loop. Each client owns one top-level session, follows it on `GET /api/v1/stream?sessionId=...`,
and loops until the time is up: it reads — the session's history tail page, the session's subagent
catalog and the session list, in turn — and after every three reads, once its previous prompt's turn
has ended (seen on its stream), it sends the next prompt to the scripted agent. So prompts never pile
up in an inbox, and reads go on while turns run.

After the time is up every client waits (on its stream) for its last turn, then reads its whole
history back page by page and checks its stream: the `session/event` seqs must be exactly the
logged seqs (none lost, none twice, none out of order), frame ids must rise, and no `reset` may
arrive. Any request that fails or answers an unexpected status counts as an error.

Reported per route: requests, requests/s, p50/p99/max latency (ms); in total: requests/s, errors and
frames. Run: `python -m bench server_load`; `DSH_BENCH_SERVER_LOAD_S=5` for a quick run,
`DSH_BENCH_SERVER_LOAD_CLIENTS` to change the client count.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import QUICK, count_target, info, print_table, write_json

DURATION_S = float(os.environ.get("DSH_BENCH_SERVER_LOAD_S", "5" if QUICK else "30"))
CLIENTS = int(os.environ.get("DSH_BENCH_SERVER_LOAD_CLIENTS", "32"))
START_GUARD_S = 60.0
"""How long the server may take to print its URL, and a client's last turn to arrive: hang guards only."""
ANSWER = "A scripted answer from the load benchmark, long enough to stream in a few chunks."
READS = ("getSessionHistory", "listSubagents", "listSessions")


def _script(path: Path) -> None:
    path.write_text(
        json.dumps({"version": 1, "model": "bench", "agents": {"main": {"steps": [], "on": [{"text": ANSWER}]}}}),
        encoding="utf-8",
    )


class ServerProcess:
    """`dsh serve` in a child process on a fresh home; `url` and `token` come from its announcement."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.url = ""
        self.token = ""
        self.returncode: int | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._log = None

    async def start(self) -> None:
        """Start the server and read its URL (with the token: the home is new)."""
        script = self.home.parent / "script.json"
        _script(script)
        self._log = (self.home.parent / "server.log").open("wb")
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from dsh.cli.main import main; main()",
            "--home",
            str(self.home),
            "serve",
            "--port",
            "0",
            "--script",
            str(script),
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert self._process.stdout is not None
        async with asyncio.timeout(START_GUARD_S):
            while True:
                line = (await self._process.stdout.readline()).decode().strip()
                if not line:
                    raise RuntimeError("dsh serve exited before announcing its URL; see server.log")
                if line.startswith("http://"):
                    base, _, token = line.partition("#token=")
                    self.url, self.token = base.rstrip("/"), token
                    return

    async def stop(self) -> float:
        """Ask the server to stop (SIGINT, as Ctrl-C does) and return how long the graceful shutdown took."""
        process = self._process
        assert process is not None
        started = time.perf_counter()
        process.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(START_GUARD_S):
                self.returncode = await process.wait()
        except TimeoutError:
            process.kill()
            self.returncode = await process.wait()
        if process.stdout is not None:
            with contextlib.suppress(Exception):
                await process.stdout.read()
        if self._log is not None:
            self._log.close()
        return time.perf_counter() - started


@dataclass
class Frame:
    """One received push frame."""

    id: int | None
    event: str
    data: dict[str, Any]


@dataclass
class Client:
    """One simulated user (see the module docs)."""

    index: int
    base_url: str
    token: str
    session_id: str = ""
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    prompts: int = 0
    turn_ends: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _subscribed: asyncio.Event = field(default_factory=asyncio.Event)

    def http(self) -> Any:
        import httpx

        # Plain HTTP on loopback: `verify=False` skips building a certificate store per client.
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=START_GUARD_S,
            verify=False,
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=2),
        )

    async def call(self, http: Any, route: str, method: str, url: str, expected: int, **options: Any) -> Any:
        """One timed request; a failure or an unexpected status is recorded as an error (None returned)."""
        started = time.perf_counter()
        try:
            response = await http.request(method, url, **options)
        except Exception as error:
            self.errors.append(f"{route}: {error!r}")
            return None
        elapsed = time.perf_counter() - started
        if response.status_code != expected:
            self.errors.append(f"{route}: {response.status_code} {response.text[:200]}")
            return None
        self.latencies[route].append(elapsed)
        return response.json()

    async def listen(self, http: Any) -> None:
        """Follow the session's push stream, recording frames, until it ends or is cancelled."""
        try:
            async with http.stream("GET", "/api/v1/stream", params={"sessionId": self.session_id}) as response:
                if response.status_code != 200:
                    self.errors.append(f"streamEvents: {response.status_code}")
                    return
                self._subscribed.set()
                fields: dict[str, str] = {}
                async for line in response.aiter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                        continue
                    if not fields:
                        continue
                    frame_id = fields.get("id")
                    frame = Frame(
                        int(frame_id) if frame_id else None, fields.get("event", ""), json.loads(fields["data"])
                    )
                    fields = {}
                    self.frames.append(frame)
                    if frame.event == "session/event" and frame.data.get("type") == "turn/end":
                        self.turn_ends += 1
                        self._arrived.set()
        except Exception as error:
            self.errors.append(f"streamEvents: {error!r}")
        finally:
            self._subscribed.set()

    async def setup(self, http: Any) -> asyncio.Task[None]:
        """Create the session and subscribe to it before anything is prompted."""
        created = await self.call(http, "createSession", "POST", "/api/v1/sessions", 201, json={})
        if created is None:
            raise RuntimeError(f"client {self.index} could not create its session: {self.errors[-1]}")
        self.session_id = created["session"]["id"]
        listener = asyncio.create_task(self.listen(http))
        await asyncio.wait_for(self._subscribed.wait(), START_GUARD_S)
        return listener

    async def drive(self, http: Any, deadline: float) -> None:
        """Prompt when the previous answer arrived, read otherwise, until `deadline`."""
        sid = self.session_id
        step = self.index  # clients start at different reads
        reads = len(READS)
        while time.perf_counter() < deadline:
            if self.turn_ends >= self.prompts and reads >= len(READS):
                body = {"content": [{"type": "text", "text": f"client {self.index} prompt {self.prompts}"}]}
                if await self.call(http, "promptSession", "POST", f"/api/v1/sessions/{sid}/prompt", 202, json=body):
                    self.prompts += 1
                reads = 0
                continue
            route = READS[step % len(READS)]
            step += 1
            reads += 1
            if route == "getSessionHistory":
                await self.call(http, route, "GET", f"/api/v1/sessions/{sid}/history", 200)
            elif route == "listSubagents":
                await self.call(http, route, "GET", f"/api/v1/sessions/{sid}/subagents", 200)
            else:
                await self.call(http, route, "GET", "/api/v1/sessions", 200, params={"limit": 50})

    async def drain(self) -> None:
        """Wait (on the stream) until the turn of every accepted prompt has ended."""

        async def wait() -> None:
            while self.turn_ends < self.prompts:
                self._arrived.clear()
                await self._arrived.wait()

        await asyncio.wait_for(wait(), START_GUARD_S)

    async def logged_seqs(self, http: Any) -> list[int]:
        """Every logged seq but streamed chunks, read back through the history pages."""
        seqs: list[int] = []
        params: dict[str, Any] = {"maxMessages": 200}
        while True:
            page = await self.call(
                http, "history (check)", "GET", f"/api/v1/sessions/{self.session_id}/history", 200, params=params
            )
            if page is None:
                return seqs
            seqs[:0] = [
                entry["event"]["seq"] for entry in page["events"] if entry["event"]["type"] != "assistant/chunk"
            ]
            if not page["hasMore"]:
                return seqs
            params = {"maxMessages": 200, "beforeSeq": page["nextBeforeSeq"]}

    def check_frames(self, logged: list[int]) -> dict[str, int]:
        """Lost, duplicated and out-of-order `session/event` frames against the log, plus id order and resets."""
        received = [frame.data["seq"] for frame in self.frames if frame.event == "session/event"]
        # Delta frames (streamed text) are transient and carry no id; every other frame's id rises.
        ids = [frame.id for frame in self.frames if frame.event != "session/delta"]
        return {
            "received": len(received),
            "lost": len(set(logged) - set(received)),
            "duplicated": len(received) - len(set(received)),
            "out_of_order": sum(1 for a, b in itertools.pairwise(received) if b <= a),
            "unexpected": 0 if received == logged else 1,
            "ids_not_rising": sum(1 for a, b in itertools.pairwise(ids) if a is None or b is None or b <= a),
            "resets": sum(1 for frame in self.frames if frame.event == "reset"),
        }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def _run(duration_s: float, clients: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        server = ServerProcess(Path(folder) / "home")
        await server.start()
        users = [Client(index, server.url, server.token) for index in range(clients)]
        pools = [user.http() for user in users]
        listeners: list[asyncio.Task[None]] = []
        frame_checks: list[dict[str, int]] = []
        try:
            listeners = list(await asyncio.gather(*(user.setup(http) for user, http in zip(users, pools, strict=True))))
            started = time.perf_counter()
            deadline = started + duration_s
            await asyncio.gather(*(user.drive(http, deadline) for user, http in zip(users, pools, strict=True)))
            elapsed = time.perf_counter() - started
            await asyncio.gather(*(user.drain() for user in users))
            for user, http in zip(users, pools, strict=True):
                frame_checks.append(user.check_frames(await user.logged_seqs(http)))
        finally:
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
            for http in pools:
                await http.aclose()
            shutdown_s = await server.stop()
    latencies: dict[str, list[float]] = defaultdict(list)
    for user in users:
        for route, values in user.latencies.items():
            latencies[route].extend(values)
    errors = [error for user in users for error in user.errors]
    timed = {route: values for route, values in latencies.items() if route in (*READS, "promptSession")}
    total = sum(len(values) for values in timed.values())
    frames = {key: sum(check[key] for check in frame_checks) for key in frame_checks[0]} if frame_checks else {}
    return {
        "duration_s": elapsed,
        "clients": clients,
        "requests": total,
        "requests_per_s": total / elapsed,
        "errors": len(errors),
        "error_samples": errors[:10],
        "frames": frames,
        "prompts": sum(user.prompts for user in users),
        "server_exit_code": server.returncode,
        "shutdown_s": shutdown_s,
        "routes": {
            route: {
                "requests": len(values),
                "requests_per_s": len(values) / elapsed,
                "p50_ms": _percentile(values, 0.50) * 1000,
                "p99_ms": _percentile(values, 0.99) * 1000,
                "max_ms": max(values) * 1000,
            }
            for route, values in sorted(timed.items())
        },
    }


def main() -> None:
    """Run the load, print the tables and write `bench/results/server_load.json`."""
    result = asyncio.run(_run(DURATION_S, CLIENTS))
    rows = [
        [route, stats["requests"], stats["requests_per_s"], stats["p50_ms"], stats["p99_ms"], stats["max_ms"]]
        for route, stats in result["routes"].items()
    ]
    rows.append(["all", result["requests"], result["requests_per_s"], "", "", ""])
    print_table(
        f"dsh serve under load: {result['clients']} clients for {result['duration_s']:.1f} s"
        " (loopback, JSONL, scripted model)",
        ["route", "requests", "req/s", "p50 ms", "p99 ms", "max ms"],
        rows,
    )
    frames = result["frames"]
    clean = (
        result["errors"] == 0
        and frames.get("lost", 1) == 0
        and frames.get("duplicated", 1) == 0
        and frames.get("out_of_order", 1) == 0
        and frames.get("unexpected", 1) == 0
        and frames.get("ids_not_rising", 1) == 0
        and frames.get("resets", 1) == 0
    )
    print(
        f"\nerrors: {result['errors']}  prompts: {result['prompts']}  session/event frames: {frames.get('received')}"
        f"  lost: {frames.get('lost')}  duplicated: {frames.get('duplicated')}"
        f"  out of order: {frames.get('out_of_order')}"
        f"  resets: {frames.get('resets')}  shutdown: {result['shutdown_s']:.2f} s (exit {result['server_exit_code']})"
        f"  -> {'PASS' if clean else 'MISS'}"
    )
    for sample in result["error_samples"]:
        print(f"  error: {sample}")
    problems = result["errors"] + sum(
        frames.get(key, 1) for key in ("lost", "duplicated", "out_of_order", "unexpected", "ids_not_rising", "resets")
    )
    targets = [
        count_target(
            "R5",
            f"dsh serve, {result['clients']} clients for {result['duration_s']:.0f} s: errors plus lost, duplicated, "
            "reordered or reset stream frames",
            problems,
            "== 0",
            clean,
        )
    ]
    targets += [
        info("R5", f"{route}: p99 latency under load (p50 {stats['p50_ms']:.3g} ms)", stats["p99_ms"], unit=" ms")
        for route, stats in result["routes"].items()
    ]
    write_json("server_load", {**result, "verdict": "PASS" if clean else "MISS", "targets": targets})


if __name__ == "__main__":
    main()
